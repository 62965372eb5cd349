"""A deadline decides the markets of the next launch from the record alone: spot while the slack
allows, on-demand when it does not, back to spot at a relaunch once slack has returned."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpujobs.domain.deadline import (
    DeadlineMarkets,
    changeover,
    latest_retry,
    launch_markets,
    may_return_to_spot,
    move_market,
    must_leave_spot,
    slack_of,
)
from gpujobs.domain.effects import Launch, Outcome, SignalCheckpoint
from gpujobs.domain.job import MAX_ATTEMPTS_KEPT, Attempt, Job, Market, StopRequest
from gpujobs.domain.ladder import SubnetZone, job_markets, markets_for, movable_markets, next_try_at, plan_ladder
from gpujobs.domain.spec import load_spec
from gpujobs.domain.spec_errors import SpecError
from gpujobs.domain.states import JobState, Reason

SUBMITTED = datetime(2026, 3, 1, tzinfo=UTC)
DEADLINE = {"hours": 52, "expected_hours": 48, "total_steps": 4800}
"""48 h of work, 100 steps an hour, due 52 h after submission; checkpoints every 30 min, so one
changeover is 8 + 1 + 30 = 39 min and the job must go on-demand once less than 48 h + 78 min remain."""
SUBNETS = [SubnetZone("subnet-a", "us-east-1a")]
BOTH = (Market.SPOT, Market.ON_DEMAND)


def job(*, step: int | None = None, **spec: object) -> Job:
    body = {"name": "j", "image": "r/i:1", "command": ["x"], "instance_types": ["p3.2xlarge"], **spec}
    submitted = Job.submitted(job_id="j-1", spec=load_spec(json.dumps(body)), now=SUBMITTED, message_id="m")
    return submitted.model_copy(update={"checkpoint_step": step})


def at(hours: float, minutes: float = 0) -> datetime:
    return SUBMITTED + timedelta(hours=hours, minutes=minutes)


@pytest.mark.parametrize(
    ("now", "step", "expected"),
    [
        pytest.param(at(0), None, DeadlineMarkets.SPOT_ONLY, id="at submission: 3.3 h of slack, wait for spot"),
        pytest.param(at(10), 1000, DeadlineMarkets.SPOT_ONLY, id="ahead of the uniform-progress line"),
        pytest.param(at(10), 900, DeadlineMarkets.SPOT_FIRST, id="behind the line: on-demand if spot has no room"),
        pytest.param(at(2, 41), None, DeadlineMarkets.SPOT_FIRST, id="a minute before the slack runs out"),
        pytest.param(at(2, 42), None, DeadlineMarkets.ON_DEMAND, id="slack down to one changeover: on-demand"),
        pytest.param(at(30), 1800, DeadlineMarkets.ON_DEMAND, id="no slack left"),
        pytest.param(at(51), 4000, DeadlineMarkets.ON_DEMAND, id="already late: on-demand all the same"),
        pytest.param(at(60), 4000, DeadlineMarkets.ON_DEMAND, id="past the deadline"),
        pytest.param(at(30), 3000, DeadlineMarkets.SPOT_ONLY, id="slack returned (on-demand ran ahead): spot again"),
        pytest.param(at(40), 4800, DeadlineMarkets.SPOT_ONLY, id="all the work committed"),
    ],
)
def test_the_next_launchs_markets_follow_the_slack(now: datetime, step: int | None, expected: DeadlineMarkets) -> None:
    assert launch_markets(job(step=step, deadline=DEADLINE), now=now) is expected


def test_without_a_deadline_nothing_is_decided_and_the_ladder_is_todays() -> None:
    plain = job()
    assert launch_markets(plain, now=at(5)) is None
    assert slack_of(plain, now=at(5)) is None
    assert job_markets(plain, now=at(5)) == [Market.SPOT, Market.ON_DEMAND]
    assert latest_retry(plain, at(9)) == at(9)


def test_the_slack_is_the_time_left_less_the_work_left_and_one_changeover() -> None:
    standing = slack_of(job(step=1200, deadline=DEADLINE), now=at(10))
    assert standing is not None
    assert standing.deadline_at == at(52)
    assert standing.work_left == timedelta(hours=36)
    assert standing.changeover == timedelta(minutes=39) == changeover(job(deadline=DEADLINE))
    assert standing.slack == timedelta(hours=6) - timedelta(minutes=39)


@pytest.mark.parametrize(
    ("markets", "spot_only", "interruptions", "expected"),
    [
        (DeadlineMarkets.ON_DEMAND, False, 0, [Market.ON_DEMAND]),
        (DeadlineMarkets.SPOT_FIRST, False, 0, [Market.SPOT, Market.ON_DEMAND]),
        (DeadlineMarkets.SPOT_ONLY, False, 0, [Market.SPOT]),
        pytest.param(
            DeadlineMarkets.SPOT_ONLY, False, 5, [Market.SPOT], id="spot-first: its interruption count moves nothing"
        ),
        pytest.param(DeadlineMarkets.ON_DEMAND, True, 0, [Market.SPOT], id="a budget's spot-only wins"),
    ],
)
def test_the_ladder_narrows_spot_first_to_what_the_deadline_allows(
    markets: DeadlineMarkets, spot_only: bool, interruptions: int, expected: list[Market]
) -> None:
    spec = job(deadline=DEADLINE).require_spec()
    allowed = markets_for(spec, interruptions=interruptions, spot_only=spot_only, deadline=markets)
    assert [r.market for r in plan_ladder(spec, SUBNETS, markets=allowed)] == expected


def test_a_job_waiting_for_spot_retries_no_later_than_when_it_must_go_on_demand() -> None:
    waiting = job(step=2400, deadline=DEADLINE)  # 24 h of work left: on-demand from 52 - 24 - 1.3 h on
    assert latest_retry(waiting, at(40)) == at(26, 42)
    assert latest_retry(waiting, at(20)) == at(20)
    assert next_try_at(waiting, now=at(26, 41.5), jitter=0.999) == at(26, 42)  # the 60 s backoff capped


def running(*, market: Market, heartbeat_step: int, interrupted: bool = False) -> Job:
    attempt = Attempt(
        number=1,
        started_at=at(0),
        instance_ids=("i-1",),
        market=market,
        heartbeat_step=heartbeat_step,
        interrupted_at=at(20) if interrupted else None,
    )
    return job(step=heartbeat_step, deadline=DEADLINE).with_attempt(attempt, now=at(20))


@pytest.mark.parametrize(
    ("job_", "expected"),
    [
        pytest.param(running(market=Market.SPOT, heartbeat_step=1800), False, id="on schedule: keeps its slack"),
        pytest.param(running(market=Market.SPOT, heartbeat_step=1400), True, id="training too slowly: leave spot"),
        pytest.param(running(market=Market.ON_DEMAND, heartbeat_step=1400), False, id="on-demand already"),
        pytest.param(
            running(market=Market.SPOT, heartbeat_step=1400, interrupted=True), False, id="being reclaimed already"
        ),
    ],
)
def test_a_running_spot_attempt_leaves_spot_only_when_its_slack_is_gone(job_: Job, expected: bool) -> None:
    assert must_leave_spot(job_, now=at(20)) is expected


def test_a_running_job_without_a_deadline_never_leaves_spot() -> None:
    attempt = Attempt(number=1, started_at=at(0), instance_ids=("i-1",), market=Market.SPOT, heartbeat_step=1)
    assert must_leave_spot(job().with_attempt(attempt, now=at(0)), now=at(500)) is False


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"capacity": "spot"}, "deadline: needs capacity spot-first (got spot)"),
        ({"capacity": "on-demand"}, "deadline: needs capacity spot-first (got on-demand)"),
        ({"deadline": {**DEADLINE, "expected_hours": 60}}, "expected_hours 60 cannot fit before the deadline"),
        ({"deadline": {**DEADLINE, "hours": "52h"}}, "deadline.hours: Input should be a valid number"),
        ({"deadline": {"hours": 52}}, "deadline.expected_hours: Field required"),
        ({"deadline": {**DEADLINE, "total_steps": 0}}, "deadline.total_steps: Input should be greater than or equal"),
    ],
)
def test_a_deadline_is_validated_strictly(extra: dict[str, object], problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        job(**{"deadline": DEADLINE, **extra})
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def on_demand_ahead(*, heartbeat_step: int, hours: float) -> Job:
    """RUNNING on on-demand since 4 h, its heartbeat at `heartbeat_step`."""
    attempt = Attempt(
        number=1, started_at=at(4), instance_ids=("i-1",), market=Market.ON_DEMAND, heartbeat_step=heartbeat_step
    )
    queued = job(step=heartbeat_step - 30, deadline=DEADLINE)
    launching = queued.with_attempt(attempt, now=at(4)).transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=at(4))
    return launching.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=at(hours))


@pytest.mark.parametrize(
    ("step", "hours", "expected"),
    [
        pytest.param(1000, 10, False, id="ahead by 1.2 h, less than two changeovers: stays on-demand"),
        pytest.param(1100, 10, True, id="ahead by 2.2 h with 3.3 h of slack: back to spot"),
        pytest.param(4560, 48, False, id="ahead by 1.4 h, but 0.95 h of slack: stays on-demand"),
    ],
)
def test_an_on_demand_attempt_goes_back_to_spot_only_well_ahead_of_schedule(
    step: int, hours: float, expected: bool
) -> None:
    assert may_return_to_spot(on_demand_ahead(heartbeat_step=step, hours=hours), now=at(hours)) is expected


def test_moving_market_checkpoints_and_replaces_the_attempt_without_counting_an_interruption() -> None:
    ahead = on_demand_ahead(heartbeat_step=1100, hours=10)
    decision = move_market(ahead, now=at(10), allowed=BOTH)
    assert decision.outcome is Outcome.MARKET_CHANGED
    assert decision.job is not None
    assert decision.job.state is JobState.INTERRUPTED
    assert decision.job.history[-1].reason is Reason.DEADLINE_MARKET
    assert "move to spot" in decision.detail
    assert decision.job.interruptions == 0
    assert decision.job.attempts[-1].interrupted_at == at(10)
    assert decision.effects == (SignalCheckpoint(("i-1",), "gpujobs-j-1-a1"), Launch("j-1"))
    # the replacement's ladder, read from the moved record: spot only
    assert launch_markets(decision.job, now=at(10)) is DeadlineMarkets.SPOT_ONLY


def test_a_job_on_schedule_or_stopping_is_not_moved() -> None:
    assert move_market(on_demand_ahead(heartbeat_step=1000, hours=10), now=at(10), allowed=BOTH).job is None
    stopping = on_demand_ahead(heartbeat_step=1100, hours=10).model_copy(
        update={"stop_request": StopRequest(reason=Reason.IDLE, requested_at=at(10), deadline=at(11))}
    )
    assert move_market(stopping, now=at(10), allowed=BOTH).outcome is Outcome.NOT_RUNNING


def test_a_move_to_a_market_no_launch_may_use_now_is_not_made_and_the_attempt_trains_on() -> None:
    """Issue 19, item 6: a move whose replacement would land on the market it left (a budget's
    spot-only) or nowhere (a budget hold) is no move. A spot-first job's interruption count no
    longer narrows its markets (issue 21): only a `spot` job has a limit."""
    ahead = on_demand_ahead(heartbeat_step=1100, hours=10)  # wants to go back to spot
    slow = (
        running(market=Market.SPOT, heartbeat_step=1400)  # must leave spot for on-demand
        .transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=at(0))
        .transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=at(0))
    )
    past_limit = ahead.model_copy(update={"interruptions": 5})  # spot-first's default max_interruptions
    assert movable_markets(ahead, spot_only=False, hold=False) == [Market.SPOT, Market.ON_DEMAND]
    assert movable_markets(past_limit, spot_only=False, hold=False) == [Market.SPOT, Market.ON_DEMAND]
    assert movable_markets(ahead, spot_only=True, hold=False) == [Market.SPOT]
    assert movable_markets(ahead, spot_only=False, hold=True) == []

    kept = move_market(slow, now=at(20), allowed=movable_markets(slow, spot_only=True, hold=False))
    assert kept.outcome is Outcome.NOTHING_TO_DECIDE
    assert kept.job is None
    assert kept.effects == ()
    assert "wants on-demand" in kept.detail
    held = move_market(ahead, now=at(10), allowed=movable_markets(ahead, spot_only=False, hold=True))
    assert held.job is None
    assert held.effects == ()
    moved = move_market(ahead, now=at(10), allowed=movable_markets(ahead, spot_only=True, hold=False))
    assert moved.outcome is Outcome.MARKET_CHANGED  # spot is what spot-only allows


# ---- jobs whose scripts count no steps for us (issue 19, item 12) ------------------------------------


def trained_by_the_clock(mode: str, *, commits: bool, market: Market = Market.SPOT) -> Job:
    """A `directory` or `none` job training on spot since submission, 20 h in, heartbeating (the
    launcher's own heartbeat reports the manifest's sequence, not a step); with `commits`, its
    last sync 10 min ago. By steps it would look as if it had done nothing."""
    attempt = Attempt(
        number=1,
        started_at=at(0),
        instance_ids=("i-1",),
        market=market,
        heartbeat_step=120 if commits else 0,
        last_heartbeat_at=at(20),
        checkpoint_step=120 if commits else None,
        checkpoint_at=at(19, 50) if commits else None,
    )
    base = job(step=120 if commits else None, deadline=DEADLINE, checkpoint=mode).with_attempt(attempt, now=at(0))
    launching = base.transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=at(0))
    return launching.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=at(0))


def test_a_directory_job_is_measured_in_time_trained_and_keeps_spot_on_schedule() -> None:
    on_schedule = trained_by_the_clock("directory", commits=True)
    standing = slack_of(on_schedule, now=at(20), step=120)
    assert standing is not None
    # 20 h less the boot and restore trained, and counted: 48 h - 19 h 51 min left, not 48 h
    assert standing.work_left == timedelta(hours=48) - (timedelta(hours=20) - timedelta(minutes=9))
    assert must_leave_spot(on_schedule, now=at(20)) is False
    moved = move_market(on_schedule, now=at(20), allowed=BOTH)
    assert moved.outcome is Outcome.NOTHING_TO_DECIDE
    # what it keeps for a replacement is its last sync: 10 min less than it has trained
    assert slack_of(on_schedule, now=at(20)).work_left == standing.work_left + timedelta(minutes=10)  # type: ignore[union-attr]


def test_a_directory_job_that_lost_its_time_to_reclaims_still_leaves_spot_when_late() -> None:
    late = trained_by_the_clock("directory", commits=True)
    # 45 h in, its kept work still 19 h 41 min: the time left no longer covers the rest on spot
    assert must_leave_spot(late, now=at(45)) is True
    assert move_market(late, now=at(45), allowed=BOTH).outcome is Outcome.MARKET_CHANGED


def test_a_job_that_saves_nothing_is_never_moved_since_a_move_would_restart_it() -> None:
    nothing_kept = trained_by_the_clock("none", commits=False)
    assert slack_of(nothing_kept, now=at(20)).work_left == timedelta(hours=48)  # type: ignore[union-attr]
    assert move_market(nothing_kept, now=at(45), allowed=BOTH).outcome is Outcome.NOTHING_TO_DECIDE
    # its next launch, if it is ever reclaimed, is judged on the whole work: on-demand when late
    assert launch_markets(nothing_kept, now=at(3)) is DeadlineMarkets.ON_DEMAND


def test_a_directory_jobs_time_trained_outlives_the_attempts_the_record_lets_go() -> None:
    """The record keeps `MAX_ATTEMPTS_KEPT` finished attempts; the training an older one's sync kept
    is still the job's (found by the randomized proof: a 4 h sync's attempt dropped after a run of
    short crashes, the job's time trained fell to 0 and a healthy spot attempt was moved to on-demand)."""
    trained = trained_by_the_clock("directory", commits=True)
    before = slack_of(trained, now=at(21))
    first = trained.attempt(1)
    assert first is not None
    assert before is not None
    after = trained.with_attempt(first.model_copy(update={"ended_at": at(20), "end_reason": "crashed"}), now=at(20))
    for number in range(2, MAX_ATTEMPTS_KEPT + 3):  # crashes at boot, each saving nothing
        short = Attempt(number=number, started_at=at(20), instance_ids=(f"i-{number}",), market=Market.SPOT)
        after = after.with_attempt(short.model_copy(update={"ended_at": at(20), "end_reason": "crashed"}), now=at(20))
    assert after.attempt(1) is None  # let go by the record
    assert after.retired.count >= 1

    standing = slack_of(after, now=at(21))
    assert standing is not None
    assert (
        standing.work_left
        == before.work_left
        == timedelta(hours=48) - (timedelta(hours=19, minutes=50) - timedelta(minutes=9))
    )
    assert launch_markets(after, now=at(21)) is launch_markets(trained, now=at(21))
