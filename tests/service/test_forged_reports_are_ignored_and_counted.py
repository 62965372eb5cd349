"""One team's job cannot fail, "succeed" or stop another team's job by putting reports on the bus.

Any job can `PutEvents` on the stack's bus. Before reports were authenticated, a `Job Exited` naming
a victim's job and attempt was recorded as that node's exit, and a `Checkpoint Committed` completed
a pending stop. Now only a report signed with the key of the attempt it names is acted on; the
attacker holds only its own attempt's key (from its own user data), and a forged report is ignored,
counted (`ForgedReports`) and changes nothing on the victim's record.
"""

from __future__ import annotations

import json
from datetime import timedelta

from gpujobs.contract import CHECKPOINT_COMMITTED, JOB_EXITED, TRAINING_HEARTBEAT
from gpujobs.domain.effects import Outcome
from gpujobs.domain.job import Job
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport, Report, SignedReport
from gpujobs.domain.states import JobState, Reason
from gpujobs.service.reports import Reports
from gpujobs_trainer.signing import signed
from tests.service.conftest import World, spec


def running(world: World, team: str, token: str) -> Job:
    job = world.submit(spec(team=team, client_token=token), message_id=token).job
    assert job.state is JobState.RUNNING
    return job


def key_in_user_data(world: World, job: Job, attempt: int = 1) -> bytes:
    """What an instance of that attempt reads from its user data (the test renderer writes JSON)."""
    (request,) = [r for r in world.compute.calls if r.job_id == job.job_id and r.attempt == attempt]
    return bytes.fromhex(json.loads(request.user_data)["report_key"])


def as_sent(report: Report, key: bytes, world: World) -> SignedReport:
    """The report as it reaches the reports function, signed as the trainer signs it."""
    detail = signed(key, report.DETAIL_TYPE, report.signed_fields(), now=world.clock.now().timestamp())
    return SignedReport(report, signed_at=detail.get("signed_at"), signature=detail.get("signature"))


def reports(world: World) -> Reports:
    return world.reports


def test_a_job_exit_forged_with_the_attackers_own_key_neither_fails_nor_succeeds_the_victim(world: World) -> None:
    victim = running(world, "vision", "victim")
    attacker = running(world, "speech", "attacker")
    stolen_name = ExitReport(
        job_id=victim.job_id, attempt=1, exit_code=1, instance_id=victim.instance_ids[0], node_rank=0
    )

    for forged in (
        SignedReport(stolen_name),  # unsigned
        as_sent(stolen_name, key_in_user_data(world, attacker), world),  # signed with the key it holds
    ):
        reaction = reports(world).receive(forged)

        assert reaction.outcome is Outcome.UNPROVEN_REPORT
        assert reaction.ignored
        assert reaction.metrics == {"ForgedReports": 1}
    after = world.store.get(victim.job_id)
    assert after.state is JobState.RUNNING
    assert after.current_attempt is not None
    assert after.current_attempt.exit_codes == victim.current_attempt.exit_codes  # type: ignore[union-attr]


def test_a_forged_checkpoint_does_not_complete_the_victims_pending_stop(world: World) -> None:
    victim = running(world, "vision", "victim")
    world.reactions.request_stop(victim.job_id, Reason.IDLE, detail="idle")
    forged = CheckpointReport(job_id=victim.job_id, attempt=1, step=10**9, uri="s3://attacker/planted")

    reaction = reports(world).receive(as_sent(forged, b"a guessed key", world))

    assert reaction.outcome is Outcome.UNPROVEN_REPORT
    after = world.store.get(victim.job_id)
    assert after.state is JobState.RUNNING
    assert after.checkpoint_step is None
    assert world.compute.terminated == []


def test_a_report_signed_with_the_key_of_the_attempt_it_names_is_acted_on(world: World) -> None:
    job = running(world, "vision", "honest")
    key = key_in_user_data(world, job)

    checkpoint = reports(world).receive(
        as_sent(
            CheckpointReport(job_id=job.job_id, attempt=1, step=300, uri="s3://ckpt-bucket/jobs/x/step-300"), key, world
        )
    )
    heartbeat = reports(world).receive(as_sent(HeartbeatReport(job_id=job.job_id, attempt=1, step=320), key, world))
    exited = reports(world).receive(
        as_sent(
            ExitReport(job_id=job.job_id, attempt=1, exit_code=0, instance_id=job.instance_ids[0], node_rank=0),
            key,
            world,
        )
    )

    assert [checkpoint.outcome, heartbeat.outcome] == [Outcome.CHECKPOINT_RECORDED, Outcome.HEARTBEAT_RECORDED]
    assert not exited.ignored
    assert world.store.get(job.job_id).checkpoint_step == 300


def test_a_replacements_key_does_not_prove_reports_of_the_attempt_before_it(world: World) -> None:
    job = running(world, "vision", "replaced")
    world.reactions.spot_warning(job.instance_ids[0])
    second = key_in_user_data(world, job, attempt=2)

    reaction = reports(world).receive(as_sent(ExitReport(job_id=job.job_id, attempt=1, exit_code=1), second, world))

    assert reaction.outcome is Outcome.UNPROVEN_REPORT


def test_a_proven_report_replayed_after_the_retry_window_is_ignored(world: World) -> None:
    job = running(world, "vision", "late")
    sent = as_sent(HeartbeatReport(job_id=job.job_id, attempt=1, step=5), key_in_user_data(world, job), world)

    world.clock.advance(minutes=66)
    reaction = reports(world).receive(sent)

    assert reaction.outcome is Outcome.UNPROVEN_REPORT
    assert "stale" in reaction.detail or "window" in reaction.detail


def test_the_report_key_is_in_user_data_only_never_in_the_jobs_record(world: World) -> None:
    job = running(world, "vision", "secretive")
    key = key_in_user_data(world, job).hex()

    assert key not in world.store.get(job.job_id).model_dump_json()
    assert all(key not in str(event) for event in world.publisher.events)


def test_every_report_kind_is_verified(world: World) -> None:
    """The three detail-types the reports rule delivers, each refused without its proof."""
    job = running(world, "vision", "kinds")
    for report in (
        CheckpointReport(job_id=job.job_id, attempt=1, step=1, uri="s3://x"),
        HeartbeatReport(job_id=job.job_id, attempt=1, step=1),
        ExitReport(job_id=job.job_id, attempt=1, exit_code=0),
    ):
        assert report.DETAIL_TYPE in (CHECKPOINT_COMMITTED, TRAINING_HEARTBEAT, JOB_EXITED)
        assert reports(world).receive(SignedReport(report)).outcome is Outcome.UNPROVEN_REPORT
    world.clock.advance(seconds=timedelta(minutes=1).total_seconds())
    assert world.store.get(job.job_id).state is JobState.RUNNING
