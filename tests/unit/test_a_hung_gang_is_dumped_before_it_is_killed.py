"""A hung gang is dumped before it is killed (issue 22, `domain.hangs.on_hang`).

The first decision on a hung gang asks every node for its ranks' stacks (SIGUSR2 through SSM) and
records when; nothing is terminated until `HANG_DUMP_WAIT` has passed since. Deciding again on the
written record asks nothing twice; a gang that recovered and hangs again is dumped again. Decided
at injected times, on records, with no cloud.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpujobs.domain.effects import DumpStacks, Outcome, Terminate
from gpujobs.domain.hangs import HANG_DUMP_WAIT, on_hang
from gpujobs.domain.job import Admission, Job, Market
from gpujobs.domain.launching import Gang, claim_launch, record_launch
from gpujobs.domain.spec import validate_spec

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
JOB_ID = "j-0000000000000001"
GANG = Gang(("i-1", "i-2"), "g5.xlarge", "us-east-1a", Market.SPOT, "subnet-a")
OVERDUE = timedelta(minutes=15)  # the default `trainer.heartbeat_overdue_minutes`


def running_with_a_heartbeat_at(at: datetime) -> Job:
    spec = {"name": "digits", "image": "img:1", "command": ["python", "train.py"], "instance_types": ["g5.xlarge"]}
    job = Job.submitted(job_id=JOB_ID, spec=validate_spec({**spec, "nodes": 2}), now=NOW, message_id="m-1")
    claimed = claim_launch(job, now=NOW, hold=None, admission=Admission(at=NOW)).job
    assert claimed is not None
    launched = record_launch(claimed, attempt_number=1, gang=GANG, tries=(), now=NOW).job
    assert launched is not None
    assert launched.current_attempt is not None
    beat = launched.current_attempt.model_copy(update={"last_heartbeat_at": at, "heartbeat_step": 10})
    return launched.with_attempt(beat, now=at)


def written(job: Job, *, now: datetime) -> Job:
    """The record after the decision's write (the decision wrote nothing: the same record)."""
    return on_hang(job, now=now).job or job


def test_the_first_decision_on_a_hung_gang_asks_every_node_for_its_stacks_and_kills_nothing() -> None:
    job = running_with_a_heartbeat_at(NOW)
    hung_at = NOW + OVERDUE + timedelta(minutes=1)

    decision = on_hang(job, now=hung_at)

    assert decision.outcome is Outcome.HANG_DUMP_ASKED
    assert decision.effects == (DumpStacks(("i-1", "i-2"), f"gpujobs-{JOB_ID}-a1"),)
    assert decision.job is not None
    assert decision.job.current_attempt is not None
    assert decision.job.current_attempt.hang_dump_asked_at == hung_at


def test_the_gang_is_terminated_only_once_the_dumps_wait_has_passed() -> None:
    hung_at = NOW + OVERDUE + timedelta(minutes=1)
    asked = written(running_with_a_heartbeat_at(NOW), now=hung_at)

    waiting = on_hang(asked, now=hung_at + HANG_DUMP_WAIT - timedelta(seconds=1))
    killed = on_hang(asked, now=hung_at + HANG_DUMP_WAIT)

    assert (waiting.outcome, waiting.effects, waiting.job) == (Outcome.HANG_DUMP_AWAITED, (), None)
    assert killed.outcome is Outcome.HUNG_GANG_TERMINATED
    assert killed.effects == (Terminate(("i-1", "i-2")),)


def test_a_decision_taken_twice_asks_for_the_dump_once() -> None:
    hung_at = NOW + OVERDUE + timedelta(minutes=1)
    asked = written(running_with_a_heartbeat_at(NOW), now=hung_at)

    again = on_hang(asked, now=hung_at)

    assert again.outcome is Outcome.HANG_DUMP_AWAITED
    assert not any(isinstance(e, DumpStacks) for e in again.effects)


def test_a_gang_that_recovered_and_hangs_again_is_dumped_again_before_its_kill() -> None:
    first_hang = NOW + OVERDUE + timedelta(minutes=1)
    asked = written(running_with_a_heartbeat_at(NOW), now=first_hang)
    attempt = asked.current_attempt
    assert attempt is not None
    recovered_at = first_hang + timedelta(minutes=1)  # its heartbeats came back before the kill
    recovered = asked.with_attempt(attempt.model_copy(update={"last_heartbeat_at": recovered_at}), now=recovered_at)
    assert on_hang(recovered, now=recovered_at + timedelta(minutes=5)).outcome is Outcome.NOT_HUNG

    second_hang = recovered_at + OVERDUE + timedelta(minutes=1)
    decision = on_hang(recovered, now=second_hang)

    assert decision.outcome is Outcome.HANG_DUMP_ASKED
    assert not any(isinstance(e, Terminate) for e in decision.effects)


def test_a_gang_that_is_not_hung_is_neither_dumped_nor_killed() -> None:
    job = running_with_a_heartbeat_at(NOW)

    decision = on_hang(job, now=NOW + OVERDUE - timedelta(seconds=1))

    assert (decision.outcome, decision.effects, decision.job) == (Outcome.NOT_HUNG, (), None)
