"""A job whose attempt fails with a configuration error before its first step fails at once, with the
error line in its record, instead of burning every attempt on the same mistake.

Decided on the exit code and the attempt's progress (heartbeat, committed checkpoint), never on log
text; the exit report's message is kept, bounded, for `gpujobs status` to show."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpujobs.adapters.inbound_reports import REPORT_MODELS
from gpujobs.contract import JOB_EXITED, ExitCode
from gpujobs.domain.decisions import on_checkpoint, on_exit, on_heartbeat
from gpujobs.domain.effects import Launch
from gpujobs.domain.fate import Verdict
from gpujobs.domain.job import COMPLETED_END_REASON, MAX_ATTEMPTS_KEPT, MAX_DETAIL_CHARS, Admission, Job, Market
from gpujobs.domain.launching import Gang, claim_launch, record_launch
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_trainer.launch import LaunchPlan, exit_detail
from gpujobs_trainer.outcome import WorkerOutcome, decide_exit

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
JOB_ID = "j-0000000000000001"
SPEC = {
    "name": "digits",
    "image": "img:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge"],
    "max_attempts": 3,
}
ERROR = "GPUJOBS_CHECKPOINT_URI s3://nowhere/x is not reachable: AccessDenied"


def running(nodes: int = 1) -> Job:
    job = Job.submitted(job_id=JOB_ID, spec=validate_spec({**SPEC, "nodes": nodes}), now=NOW, message_id="m-1")
    claimed = claim_launch(job, now=NOW, hold=None, admission=Admission(at=NOW)).job
    assert claimed is not None
    gang = Gang(tuple(f"i-{n}" for n in range(1, nodes + 1)), "g5.xlarge", "us-east-1a", Market.SPOT, "subnet-a")
    launched = record_launch(claimed, attempt_number=1, gang=gang, tries=(), now=NOW).job
    assert launched is not None
    return launched


def exit_of(job: Job, code: int, *, instance: str = "i-1", message: str = ERROR, after: int = 30) -> Job:
    decided = on_exit(
        job,
        ExitReport(job_id=job.job_id, attempt=1, exit_code=code, instance_id=instance, node_rank=None, message=message),
        now=NOW + timedelta(seconds=after),
    )
    assert decided.job is not None
    return decided.job


@pytest.mark.parametrize("code", [ExitCode.CONFIG_ERROR, 2, 126, 127])
def test_a_configuration_error_before_the_first_step_fails_the_job_at_once(code: int) -> None:
    job = running()

    failed = exit_of(job, code)

    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.CONFIG_ERROR
    assert failed.crashes == 1  # one attempt spent, not max_attempts
    assert failed.attempts[0].end_reason == Verdict.MISCONFIGURED.value
    assert failed.attempts[0].error_line == ERROR
    assert ERROR in failed.status_detail
    assert len(failed.attempts) == 1


def test_the_failed_job_is_not_relaunched() -> None:
    decided = on_exit(
        running(),
        ExitReport(job_id=JOB_ID, attempt=1, exit_code=78, instance_id="i-1", node_rank=None, message=ERROR),
        now=NOW,
    )

    assert decided.job is not None
    assert not any(isinstance(effect, Launch) for effect in decided.effects)


def test_a_configuration_error_after_a_heartbeat_is_a_crash_retried() -> None:
    beat = on_heartbeat(
        running(), HeartbeatReport(job_id=JOB_ID, attempt=1, step=10), now=NOW + timedelta(seconds=10)
    ).job
    assert beat is not None

    retried = exit_of(beat, 78)

    assert retried.state is JobState.QUEUED
    assert retried.history[-1].reason is Reason.CRASHED_RETRYING


def test_a_configuration_error_after_a_committed_checkpoint_is_a_crash_retried() -> None:
    committed = on_checkpoint(
        running(),
        CheckpointReport(job_id=JOB_ID, attempt=1, step=100, uri="s3://b/ckpt"),
        now=NOW + timedelta(seconds=10),
    ).job
    assert committed is not None

    assert exit_of(committed, 78).state is JobState.QUEUED


@pytest.mark.parametrize("code", [1, 137, ExitCode.BOOTSTRAP_FAILED])
def test_other_failures_before_the_first_step_are_retried(code: int) -> None:
    """A crash, an OOM kill, or the bootstrap's own failure (a pull, a rendezvous timeout) may pass."""
    retried = exit_of(running(), code)

    assert retried.state is JobState.QUEUED
    assert retried.history[-1].reason is Reason.CRASHED_RETRYING


def test_the_bootstrap_failure_code_is_not_a_shells_command_not_found() -> None:
    assert ExitCode.BOOTSTRAP_FAILED not in (126, 127)


def test_in_a_gang_one_misconfigured_node_fails_the_job_once_the_gang_has_ended() -> None:
    job = running(nodes=2)

    first = exit_of(job, 78, instance="i-1")
    assert first.state is JobState.RUNNING  # the rest of the gang is terminated first
    both = exit_of(first, 1, instance="i-2", message="torch.distributed: peer closed the connection", after=40)

    assert both.state is JobState.FAILED
    assert both.history[-1].reason is Reason.CONFIG_ERROR
    assert both.attempts[0].error_line == ERROR  # the first failed exit's words, not the peer's


def test_the_error_line_is_kept_on_one_line_and_bounded() -> None:
    failed = exit_of(running(), 78, message="line one\nline two\t" + "x" * 5000)

    line = failed.attempts[0].error_line
    assert line.startswith("line one line two x")
    assert len(line) <= MAX_DETAIL_CHARS


def test_an_exit_report_carries_its_message_to_the_decision() -> None:
    detail = {"job_id": "j-0000000000000001", "attempt": 1, "exit_code": 78, "instance_id": "i-0123456789abcdef0"}
    parsed = REPORT_MODELS[JOB_EXITED].model_validate({**detail, "message": ERROR, "reason": "config-error"})

    report = parsed.report()

    assert isinstance(report, ExitReport)
    assert report.message == ERROR
    assert "message" not in report.signed_fields()  # shown, never acted on


def test_a_successful_attempts_end_reason_is_what_useful_time_counts_on() -> None:
    assert Verdict.SUCCEEDED.value == COMPLETED_END_REASON


def test_the_launchers_exit_report_carries_the_workers_configuration_error() -> None:
    """The launcher's report usually arrives first, so it is the one whose message the record keeps."""
    outcomes = [
        WorkerOutcome(rank=0, exit_code=78, reason="config-error", message=ERROR),
        WorkerOutcome(rank=1, exit_code=78, reason="config-error", message="the same, from rank 1"),
    ]
    outcome = decide_exit(torchrun_code=1, outcomes=outcomes, expected_workers=2)
    plan = LaunchPlan(
        nnodes=1,
        node_rank=0,
        nproc_per_node=2,
        master_addr="10.0.0.1",
        master_port=29500,
        rdzv_id="r",
        shutdown_timeout=90,
        command=("python", "train.py"),
        job_id=JOB_ID,
        attempt=1,
    )

    detail = exit_detail(plan, outcome)

    assert (detail["exit_code"], detail["message"]) == (78, ERROR)
    parsed = REPORT_MODELS[JOB_EXITED].model_validate(detail).report()
    assert isinstance(parsed, ExitReport)
    assert parsed.message == ERROR


# ---- progress counts over every attempt of the job, not just the one that exited ------------------
def _replacement(job: Job, *, after: timedelta) -> Job:
    """The current attempt reclaimed (its node saved and exited as preempted) and a replacement running."""
    current = job.current_attempt
    assert current is not None
    report = ExitReport(
        job_id=JOB_ID, attempt=current.number, exit_code=ExitCode.PREEMPTED, instance_id=current.instance_ids[0]
    )
    reclaimed = on_exit(job, report, now=NOW + after).job
    assert reclaimed is not None
    assert reclaimed.attempts[-1].is_over
    claimed = claim_launch(reclaimed, now=NOW + after, hold=None).job
    assert claimed is not None
    gang = Gang(("i-next",), "g5.xlarge", "us-east-1b", Market.SPOT, "subnet-b")
    replaced = record_launch(claimed, attempt_number=current.number + 1, gang=gang, tries=(), now=NOW + after).job
    assert replaced is not None
    assert replaced.state is JobState.RUNNING
    return replaced


def _exit(job: Job, code: int, *, after: timedelta) -> Job:
    current = job.current_attempt
    assert current is not None
    report = ExitReport(
        job_id=JOB_ID, attempt=current.number, exit_code=code, instance_id=current.instance_ids[0], message=ERROR
    )
    decided = on_exit(job, report, now=NOW + after)
    assert decided.job is not None
    return decided.job


def test_a_replacements_configuration_error_after_ten_hours_of_training_is_a_crash_retried() -> None:
    # given a job that trained for 10 h and heartbeated, then was reclaimed before its next commit
    trained = on_heartbeat(running(), HeartbeatReport(job_id=JOB_ID, attempt=1, step=9000), now=NOW + 10 * HOUR).job
    assert trained is not None
    replacement = _replacement(trained, after=10 * HOUR)

    # when the replacement exits 78 before its own first heartbeat (say, a store briefly unreachable)
    after = _exit(replacement, ExitCode.CONFIG_ERROR, after=10 * HOUR + timedelta(minutes=2))

    # then the job is retried on the ordinary crash path, not failed as misconfigured
    assert after.state is JobState.QUEUED
    assert after.history[-1].reason is Reason.CRASHED_RETRYING
    assert after.attempts[-1].end_reason == Verdict.CRASHED.value


def test_a_none_scripts_exit_2_after_five_hours_over_two_attempts_is_a_crash_retried() -> None:
    # given a `none` script (the launcher heartbeats at step 0) that ran 5 h, then was reclaimed
    job = Job.submitted(job_id=JOB_ID, spec=validate_spec({**SPEC, "checkpoint": "none"}), now=NOW, message_id="m-1")
    claimed = claim_launch(job, now=NOW, hold=None, admission=Admission(at=NOW)).job
    assert claimed is not None
    gang = Gang(("i-1",), "g5.xlarge", "us-east-1a", Market.SPOT, "subnet-a")
    launched = record_launch(claimed, attempt_number=1, gang=gang, tries=(), now=NOW).job
    assert launched is not None
    beat = on_heartbeat(launched, HeartbeatReport(job_id=JOB_ID, attempt=1, step=0), now=NOW + 5 * HOUR).job
    assert beat is not None
    replacement = _replacement(beat, after=5 * HOUR)

    after = _exit(replacement, 2, after=5 * HOUR + timedelta(seconds=20))

    assert after.state is JobState.QUEUED
    assert after.history[-1].reason is Reason.CRASHED_RETRYING


def test_a_commit_of_an_earlier_attempt_is_progress_too() -> None:
    committed = on_checkpoint(
        running(), CheckpointReport(job_id=JOB_ID, attempt=1, step=100, uri="s3://b/ckpt"), now=NOW + HOUR
    ).job
    assert committed is not None

    after = _exit(_replacement(committed, after=HOUR), ExitCode.CONFIG_ERROR, after=HOUR + timedelta(minutes=1))

    assert after.history[-1].reason is Reason.CRASHED_RETRYING


def test_progress_of_an_attempt_dropped_from_the_record_still_counts() -> None:
    # given a job that heartbeated in attempt 1, then was reclaimed more often than the record keeps
    job = on_heartbeat(running(), HeartbeatReport(job_id=JOB_ID, attempt=1, step=50), now=NOW + HOUR).job
    assert job is not None
    for n in range(MAX_ATTEMPTS_KEPT + 1):
        job = _replacement(job, after=HOUR + n * timedelta(minutes=5))
    assert job.attempts[0].number > 1  # attempt 1 is retired

    after = _exit(job, ExitCode.CONFIG_ERROR, after=3 * HOUR)

    assert after.history[-1].reason is Reason.CRASHED_RETRYING


def test_a_replacements_configuration_error_when_no_attempt_ever_made_progress_still_fails_at_once() -> None:
    # given an attempt that crashed at once (exit 1, retried) and a replacement that exits 78 at once
    retried = _exit(running(), 1, after=timedelta(seconds=30))
    assert retried.state is JobState.QUEUED
    claimed = claim_launch(retried, now=NOW + timedelta(minutes=1), hold=None).job
    assert claimed is not None
    gang = Gang(("i-2",), "g5.xlarge", "us-east-1a", Market.SPOT, "subnet-a")
    second = record_launch(claimed, attempt_number=2, gang=gang, tries=(), now=NOW + timedelta(minutes=1)).job
    assert second is not None

    failed = _exit(second, ExitCode.CONFIG_ERROR, after=timedelta(minutes=2))

    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.CONFIG_ERROR
