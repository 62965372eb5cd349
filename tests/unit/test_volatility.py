"""When a `spot-first` job leaves spot for its interruptions and when it goes back (`domain.volatility`):
pure decisions over the record and the time."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpujobs.domain.effects import Launch, Outcome, SignalCheckpoint
from gpujobs.domain.job import Attempt, HistoryEntry, Job, Market
from gpujobs.domain.ladder import job_markets
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs.domain.volatility import (
    VOLATILE_GAP,
    VOLATILE_WINDOW,
    back_to_spot,
    failed_returns,
    moving_back_to_spot,
    probe_every,
    return_wait,
    volatile,
)

T0 = datetime(2026, 6, 1, tzinfo=UTC)
BOTH = (Market.SPOT, Market.ON_DEMAND)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def job_with(reclaims_at: list[float], *, on_demand_from: float | None = None, **spec: object) -> Job:
    """RUNNING: spot attempts reclaimed at these hours, then (with `on_demand_from`) an on-demand one,
    with the transitions each leaves in the history."""
    body = {"name": "j", "image": "r/i:1", "command": ["x"], "instance_types": ["g5.xlarge"], **spec}
    job = Job.submitted(job_id="j-1", spec=load_spec(json.dumps(body)), now=T0, message_id="m")
    job = job.transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=T0)
    job = job.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=T0)
    attempts = []
    for i, hour in enumerate(reclaims_at):
        start = at(reclaims_at[i - 1] if i else 0)
        attempts.append(
            Attempt(
                number=i + 1,
                started_at=start,
                instance_ids=(f"i-{i + 1}",),
                market=Market.SPOT,
                interrupted_at=at(hour),
                ended_at=at(hour),
            )
        )
        job = job.transition(JobState.INTERRUPTED, Reason.SPOT_INTERRUPTION, now=at(hour))
        job = job.transition(JobState.LAUNCHING, Reason.REPLACEMENT_LAUNCHING, now=at(hour))
        job = job.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=at(hour))
    if on_demand_from is not None:
        attempts.append(
            Attempt(
                number=len(attempts) + 1, started_at=at(on_demand_from), instance_ids=("i-od",), market=Market.ON_DEMAND
            )
        )
    return job.model_copy(update={"attempts": tuple(attempts), "interruptions": len(reclaims_at)})


def test_the_line_is_derived_from_the_changeover_and_the_goal() -> None:
    """9 minutes of boot and restore per interruption hold 0.95 only with 3 h between them."""
    assert timedelta(hours=3) == VOLATILE_GAP
    assert timedelta(hours=6) == VOLATILE_WINDOW


@pytest.mark.parametrize(
    ("reclaims", "now", "expected"),
    [
        pytest.param([1, 2, 3], 3, True, id="three in two hours"),
        pytest.param([1, 4, 7], 7, True, id="three in six hours"),
        pytest.param([1, 4, 7.5], 7.5, False, id="three in six and a half hours"),
        pytest.param([1, 2], 2, False, id="two"),
        pytest.param([1, 2, 3], 9.5, False, id="three, but the oldest is older than six hours now"),
    ],
)
def test_three_reclaims_within_six_hours_make_spot_volatile(reclaims: list[float], now: float, expected: bool) -> None:
    assert volatile(job_with(reclaims), now=at(now)) is expected


def test_volatility_is_a_spot_first_rule_without_a_deadline() -> None:
    deadline = {"hours": 100, "expected_hours": 10, "total_steps": 100}
    assert volatile(job_with([1, 2, 3], deadline=deadline), now=at(3)) is False
    assert volatile(job_with([1, 2, 3], capacity="spot", max_interruptions=10), now=at(3)) is False


def test_a_volatile_job_launches_on_demand_first_and_a_calm_one_spot_first() -> None:
    assert job_markets(job_with([1, 2, 3]), now=at(3)) == [Market.ON_DEMAND, Market.SPOT]
    assert job_markets(job_with([1, 2]), now=at(3)) == [Market.SPOT, Market.ON_DEMAND]
    assert job_markets(job_with([1, 2, 3]), now=at(3), spot_only=True) == [Market.SPOT]


def test_a_job_sent_to_on_demand_by_volatile_spot_waits_six_hours_before_it_goes_back() -> None:
    stay = job_with([1, 2, 3], on_demand_from=3)
    assert back_to_spot(stay, now=at(8.9), allowed=BOTH).job is None
    assert "due 0.1 h from now" in back_to_spot(stay, now=at(8.9), allowed=BOTH).detail
    decision = back_to_spot(stay, now=at(9), allowed=BOTH)
    assert decision.outcome is Outcome.MARKET_CHANGED
    moved = decision.job
    assert moved is not None
    assert moved.state is JobState.INTERRUPTED
    assert moved.history[-1].reason is Reason.BACK_TO_SPOT
    assert moved.interruptions == 3  # a move is no interruption
    assert moved.attempts[-1].moved
    assert decision.effects == (SignalCheckpoint(("i-od",), "gpujobs-j-1-a4"), Launch("j-1"))
    assert moving_back_to_spot(moved)
    assert job_markets(moved, now=at(9)) == [Market.SPOT]  # its replacement: spot only


def test_no_return_while_spot_reclaimed_the_job_less_than_three_hours_ago() -> None:
    recent = job_with([1], on_demand_from=1)
    assert timedelta(hours=3) == VOLATILE_GAP
    assert "less than 3 hours ago" in back_to_spot(recent, now=at(3.9), allowed=BOTH).detail
    assert back_to_spot(recent, now=at(4), allowed=BOTH).outcome is Outcome.MARKET_CHANGED


def test_a_job_on_demand_for_want_of_spot_room_looks_for_spot_after_its_checkpoint_interval() -> None:
    no_room = job_with([], on_demand_from=0, checkpoint_every_minutes=45)
    assert probe_every(no_room) == timedelta(minutes=45)
    assert back_to_spot(no_room, now=at(0.7), allowed=BOTH).job is None
    assert back_to_spot(no_room, now=at(0.75), allowed=BOTH).outcome is Outcome.MARKET_CHANGED
    assert probe_every(job_with([], checkpoint_every_minutes=5)) == timedelta(minutes=10)  # never under 10 min


def cycle(start: float, *, reclaimed_after: float | None = 0.5, room: bool = True) -> list[HistoryEntry]:
    """What one return to spot leaves in the history: the move, its launch (or no room), and the
    reclaim of its spot attempt `reclaimed_after` hours later (None: spot held)."""
    r, i, lch = JobState.RUNNING, JobState.INTERRUPTED, JobState.LAUNCHING
    entries = [_entry(at(start), r, i, Reason.BACK_TO_SPOT)]
    entries.append(_entry(at(start), lch, r, Reason.INSTANCES_LAUNCHED if room else Reason.BACK_TO_SPOT))
    if room and reclaimed_after is not None:
        entries.append(_entry(at(start + reclaimed_after), r, i, Reason.SPOT_INTERRUPTION))
        entries.append(_entry(at(start + reclaimed_after), lch, r, Reason.INSTANCES_LAUNCHED))
    return entries


def test_each_failed_return_doubles_the_next_wait_up_to_a_day() -> None:
    """A return that spot answers with a reclaim within 3 hours cost two boots: the next try waits
    twice as long (from an on-demand stay volatile spot began: 6, 12, 24 hours, no more)."""
    stay = job_with([1, 2, 3], on_demand_from=3)

    def wait(*cycles: list[HistoryEntry], now: float = 50) -> timedelta:
        history = (*stay.history, *(e for c in cycles for e in c))
        return return_wait(stay.model_copy(update={"history": history}), now=at(now))[1]

    assert wait() == timedelta(hours=6)
    assert wait(cycle(20)) == timedelta(hours=12)
    assert wait(cycle(10), cycle(20)) == timedelta(hours=24)
    assert wait(cycle(0), cycle(10), cycle(20), cycle(30)) == timedelta(hours=24)  # a day at most
    assert wait(cycle(20, reclaimed_after=4)) == timedelta(hours=6)  # spot held 4 hours: a return that worked
    assert wait(cycle(20, reclaimed_after=None)) == timedelta(hours=6)
    assert wait(cycle(20), now=80) == timedelta(hours=6)  # forgotten after 48 hours
    assert failed_returns(stay.model_copy(update={"history": (*stay.history, *cycle(20))}), now=at(50)) == 1


def test_tries_that_found_no_spot_room_double_the_next_try_up_to_three_hours() -> None:
    no_room = job_with([], on_demand_from=0)
    refused: list[HistoryEntry] = []
    waits = []
    for hour in (0.5, 1.5, 3.5, 7.5, 10.5):
        refused += cycle(hour, room=False)
        since, wait = return_wait(no_room.model_copy(update={"history": (*no_room.history, *refused)}), now=at(12))
        assert since == at(hour)  # counted from the last try
        waits.append(wait)
    assert waits == [timedelta(hours=h) for h in (1, 2, 3, 3, 3)]


def _entry(when: datetime, source: JobState, target: JobState, reason: Reason) -> HistoryEntry:
    return HistoryEntry(at=when, source=source, target=target, reason=reason, attempt=4)


@pytest.mark.parametrize(
    ("update", "allowed", "why"),
    [
        pytest.param({}, (Market.ON_DEMAND,), "spot", id="a budget allows no spot"),
        pytest.param({"checkpoint": "none"}, BOTH, "from scratch", id="a job that saves nothing"),
    ],
)
def test_no_move_back_that_a_launch_could_not_make_or_that_would_lose_the_work(
    update: dict[str, object], allowed: tuple[Market, ...], why: str
) -> None:
    stay = job_with([1, 2, 3], on_demand_from=3, **update)
    decision = back_to_spot(stay, now=at(20), allowed=allowed)
    assert decision.job is None
    assert decision.effects == ()
    assert why in decision.detail


def test_a_job_with_a_deadline_is_left_to_its_deadline() -> None:
    deadline = {"hours": 100, "expected_hours": 10, "total_steps": 100}
    assert back_to_spot(job_with([], on_demand_from=0, deadline=deadline), now=at(20), allowed=BOTH).job is None


def test_no_return_while_the_reclaims_are_still_within_the_window_even_when_the_wait_is_over() -> None:
    """Three reclaims at one instant (a storm) send the job to on-demand at that instant; its wait of
    6 h ends exactly when the reclaims are 6 h old, still within the window: the move back waits
    until they have left it, so a return to spot is never a launch on volatile spot (the soak found it)."""
    stay = job_with([3, 3, 3], on_demand_from=3)
    held = back_to_spot(stay, now=at(9), allowed=BOTH)
    assert held.job is None
    assert held.detail == "spot is still volatile for the job"
    assert volatile(stay, now=at(9))
    later = at(9) + timedelta(minutes=1)
    assert not volatile(stay, now=later)
    assert back_to_spot(stay, now=later, allowed=BOTH).outcome is Outcome.MARKET_CHANGED
