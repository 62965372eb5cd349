"""Decisions are data: the same record and time give the same decision, and effects follow the record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpujobs.domain.decisions import on_exit, settle
from gpujobs.domain.effects import IGNORED, DeleteAlarms, Launch, Outcome, Terminate
from gpujobs.domain.job import Admission, Job, Market, StopRequest
from gpujobs.domain.launching import Gang, claim_launch, record_launch
from gpujobs.domain.reports import ExitReport
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState, Reason

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
JOB_ID = "j-0000000000000001"
SPEC = {"name": "digits", "image": "img:1", "command": ["python", "train.py"], "instance_types": ["g5.xlarge"]}
GANG = Gang(("i-1",), "g5.xlarge", "us-east-1a", Market.SPOT, "subnet-a")


def launching() -> Job:
    job = Job.submitted(job_id=JOB_ID, spec=validate_spec(SPEC), now=NOW, message_id="m-1")
    claimed = claim_launch(job, now=NOW, hold=None, admission=Admission(at=NOW)).job
    assert claimed is not None
    return claimed


def running() -> Job:
    job = record_launch(launching(), attempt_number=1, gang=GANG, tries=(), now=NOW).job
    assert job is not None
    return job


def with_due_stop(job: Job) -> Job:
    request = StopRequest(reason=Reason.IDLE, requested_at=NOW, deadline=NOW + timedelta(minutes=10))
    return job.model_copy(update={"stop_request": request})


def test_a_due_stop_terminates_on_every_settle_and_is_stamped_executed_once() -> None:
    job = with_due_stop(running())
    later = NOW + timedelta(minutes=11)

    first = settle(job, now=later)
    assert first.job is not None
    assert first.job.stop_request is not None
    assert first.job.stop_request.executed_at == later
    again = settle(first.job, now=later + timedelta(minutes=1))

    assert first.effects == again.effects == (Terminate(("i-1",)),)
    assert again.job is None  # nothing new to write; the effect is issued all the same


def test_the_same_record_and_time_give_the_same_decision() -> None:
    job = with_due_stop(running())
    later = NOW + timedelta(minutes=11)

    assert settle(job, now=later) == settle(job, now=later)


def test_a_new_attempt_starts_without_the_stop_request_of_an_old_one() -> None:
    job = with_due_stop(running())
    first = job.current_attempt
    assert first is not None
    ended = job.with_attempt(first.model_copy(update={"ended_at": NOW}), now=NOW)
    interrupted = ended.transition(JobState.INTERRUPTED, Reason.SPOT_INTERRUPTION, now=NOW)

    claimed = claim_launch(interrupted, now=NOW, hold=None).job

    assert claimed is not None
    assert claimed.stop_request is None
    assert [a.number for a in claimed.attempts] == [1, 2]


def test_an_exit_before_the_launch_record_is_kept_by_rank_and_judged_once_recorded() -> None:
    kept = on_exit(
        launching(), ExitReport(job_id=JOB_ID, attempt=1, exit_code=0, instance_id=None, node_rank=0), now=NOW
    ).job
    assert kept is not None

    recorded = record_launch(kept, attempt_number=1, gang=GANG, tries=(), now=NOW)

    assert recorded.job is not None
    assert recorded.job.state is JobState.SUCCEEDED
    assert DeleteAlarms(("i-1",)) in recorded.effects
    assert not any(isinstance(e, Launch) for e in recorded.effects)


def test_a_gang_started_for_a_job_that_moved_on_is_terminated() -> None:
    moved_on = running().transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=NOW)
    other = Gang(("i-9",), "g5.xlarge", "us-east-1b", Market.SPOT, "subnet-b")

    decision = record_launch(moved_on, attempt_number=1, gang=other, tries=(), now=NOW)

    assert decision.outcome is Outcome.LAUNCH_ABANDONED
    assert decision.effects == (Terminate(("i-9",)),)


def test_only_the_ignored_outcomes_read_as_ignored() -> None:
    assert {o for o in Outcome if o.ignored} == IGNORED
    assert all(o.value.startswith("ignored: ") == o.ignored for o in Outcome)
