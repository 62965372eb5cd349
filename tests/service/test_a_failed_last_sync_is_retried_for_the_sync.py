"""A `directory` script that ends well but whose folder's last sync fails (issue 19, item 12).

The launcher exits 74 (`ExitCode.SYNC_FAILED`): the script exited 0, or was stopped from outside,
and the folder in S3 is the previous sync's. That used to be judged the script's crash
(`crashed-retrying`, `crashed-too-often`). Now it is its own verdict: the job is relaunched from
the sync before, under reason `sync-failed`, still counted toward `max_attempts` so that a bucket
that refuses every sync fails the job, with that reason, instead of retrying it forever.
"""

from __future__ import annotations

from gpujobs.contract import ExitCode
from gpujobs.domain.job import Job
from gpujobs.domain.reports import CheckpointReport, ExitReport
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, spec


def exits(world: World, job: Job, code: int) -> Job:
    current = world.store.get(job.job_id)
    attempt = current.current_attempt
    assert attempt is not None
    (iid,) = attempt.instance_ids
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=attempt.number, exit_code=code, instance_id=iid))
    world.reactions.instance_state(iid, "terminated")
    return world.store.get(job.job_id)


def test_a_script_that_ended_well_but_whose_last_sync_failed_is_relaunched_for_the_sync(world: World) -> None:
    job = world.submit(spec(checkpoint="directory", max_attempts=3)).job
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=4, uri="s3://b/manifest-4"))

    after = exits(world, job, ExitCode.SYNC_FAILED)

    assert after.state is JobState.RUNNING  # relaunched at once
    assert after.attempt_count == 2
    assert after.current_attempt is not None
    assert after.current_attempt.resume_from_step == 4  # from the sync before
    reasons = [h.reason for h in after.history]
    assert Reason.SYNC_FAILED in reasons
    assert Reason.CRASHED_RETRYING not in reasons


def test_a_sync_that_fails_every_time_fails_the_job_once_its_attempts_are_used(world: World) -> None:
    job = world.submit(spec(checkpoint="directory", max_attempts=2)).job
    exits(world, job, ExitCode.SYNC_FAILED)
    failed = exits(world, job, ExitCode.SYNC_FAILED)

    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.SYNC_FAILED
    assert failed.attempt_count == 2


def test_a_sync_failure_alongside_a_real_crash_is_a_crash(world: World) -> None:
    job = world.submit(spec(checkpoint="directory", nodes=2, max_attempts=3)).job
    attempt = job.current_attempt
    assert attempt is not None
    first, second = attempt.instance_ids
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, exit_code=ExitCode.SYNC_FAILED, instance_id=first))
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, exit_code=1, instance_id=second))
    for iid in (first, second):
        world.reactions.instance_state(iid, "terminated")

    after = world.store.get(job.job_id)
    assert Reason.CRASHED_RETRYING in [h.reason for h in after.history]
