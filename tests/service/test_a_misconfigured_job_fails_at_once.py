"""A signed exit report with a configuration error's code, before the attempt's first step, fails the
job at once through the reports service: no relaunch, the report's message on the attempt and in the
job's detail, one attempt spent instead of `max_attempts` (3 by default)."""

from __future__ import annotations

from gpujobs.domain.reports import ExitReport, HeartbeatReport
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World
from tests.service.test_forged_reports_are_ignored_and_counted import as_sent, key_in_user_data, reports, running

ERROR = "python: can't open file '/opt/gpujobs/examples/digits/train.py': [Errno 2] No such file or directory"


def test_a_configuration_error_report_fails_the_job_with_its_error_line(world: World) -> None:
    job = running(world, "vision", "misconfigured")
    exited = ExitReport(
        job_id=job.job_id, attempt=1, exit_code=78, instance_id=job.instance_ids[0], node_rank=0, message=ERROR
    )

    reports(world).receive(as_sent(exited, key_in_user_data(world, job), world))

    failed = world.store.get(job.job_id)
    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.CONFIG_ERROR
    assert failed.attempts[-1].error_line == ERROR
    assert ERROR in failed.status_detail
    assert [r.attempt for r in world.compute.calls if r.job_id == job.job_id] == [1]  # never relaunched


def test_a_crash_before_the_first_step_is_still_retried(world: World) -> None:
    job = running(world, "vision", "crashing")
    exited = ExitReport(job_id=job.job_id, attempt=1, exit_code=1, instance_id=job.instance_ids[0], node_rank=0)

    reports(world).receive(as_sent(exited, key_in_user_data(world, job), world))

    retried = world.store.get(job.job_id)
    assert retried.state in (JobState.QUEUED, JobState.RUNNING)  # relaunched at once when capacity allows
    assert Reason.CRASHED_RETRYING in [h.reason for h in retried.history]


def test_a_replacements_configuration_error_after_the_job_trained_is_retried_not_failed(world: World) -> None:
    # given a job whose first attempt trained to step 5000 and was then reclaimed by spot
    job = running(world, "vision", "trained-then-reclaimed")
    first = key_in_user_data(world, job)
    beat = HeartbeatReport(job_id=job.job_id, attempt=1, step=5000)
    assert not reports(world).receive(as_sent(beat, first, world)).ignored
    world.reactions.spot_warning(job.instance_ids[0])
    replacement = world.store.get(job.job_id)
    assert replacement.current_attempt is not None
    assert replacement.current_attempt.number == 2

    # when the replacement exits 78 before its own first heartbeat
    exited = ExitReport(
        job_id=job.job_id,
        attempt=2,
        exit_code=78,
        instance_id=replacement.instance_ids[0],
        node_rank=0,
        message="GPUJOBS_CHECKPOINT_URI s3://ckpt-bucket/jobs/x is not reachable: SlowDown",
    )
    reports(world).receive(as_sent(exited, key_in_user_data(world, job, attempt=2), world))

    # then the job is retried as a crash (one of its attempts spent), not failed as misconfigured
    after = world.store.get(job.job_id)
    assert after.state is not JobState.FAILED
    assert Reason.CRASHED_RETRYING in [h.reason for h in after.history]
    assert Reason.CONFIG_ERROR not in [h.reason for h in after.history]
    assert after.crashes == 1
    assert [r.attempt for r in world.compute.calls if r.job_id == job.job_id] == [1, 2, 3]
