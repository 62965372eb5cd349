"""Spot too volatile for a job, and spot calm again: when a `spot-first` job leaves spot, and when it
goes back.

What an interruption costs is known without any trace: the replacement's boot and restore
(`BOOT_ALLOWANCE` + `RESTORE_ALLOWANCE`, 9 minutes) are paid and train nothing, and the work after the
warning's save is seconds. A job interrupted every T on average keeps a goodput of about
1 - 9 min / T on spot, so the 0.95 this project holds itself to needs T >= 3 h. `VOLATILE_COUNT`
interruptions within `VOLATILE_WINDOW` (3 in 6 hours: a mean gap of 3 hours or less) is that line:
past it, a `spot-first` job without a deadline launches on on-demand first (`ladder.markets_for`;
spot still when on-demand has no room), where nothing is reclaimed. It is derived from the
changeover's cost and the goal, not fitted to any trace. A job with a deadline is left to its
deadline's rule (`domain.deadline`), which weighs the same risk against the time left.

Back to spot: a `spot-first` job without a deadline that trains on on-demand is moved back
(`back_to_spot`: checkpoint, then a spot-only replacement, make before break; with no spot room the
on-demand attempt trains on). A return is a probe of spot, and it is timed as one (`return_wait`):

- never while spot has reclaimed the job within the last `VOLATILE_GAP` (3 hours): one reclaim that
  recent is the rate the goal cannot afford;
- the first try comes `probe_every` after the on-demand launch (the job's checkpoint interval, 30
  minutes by default: each try asks for one checkpoint) when the job landed there for want of spot
  room, and `VOLATILE_WINDOW` (6 hours) after it when volatile spot sent it there;
- each try that found no spot room doubles the wait before the next (counted from that try) up to
  `VOLATILE_GAP`: such a try costs one refused RunInstances per pool, a checkpoint and three
  transitions of the record's history, so a few an hour at first and eight a day at most;
- a return within `BACKOFF_MEMORY` that spot answered with a reclaim within `VOLATILE_GAP` failed:
  it cost two boots (the spot replacement's, and the on-demand one that follows it). After one, a
  stay counts as volatile (its first try waits `VOLATILE_WINDOW`), and each doubles the wait, up to
  `MAX_WAIT`.

On-demand costs about three times spot, so a return that holds pays for its changeover within the
first half hour on spot; the doubling keeps what failed returns and refused tries cost bounded
while spot stays bad (a few tries a day, each one refused RunInstances or two boots).

`max_interruptions` is a limit of `spot` jobs only, which fail past it; a `spot-first` job is never
given up for its interruptions.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from gpujobs.domain.attempts import BOOT_ALLOWANCE, RESTORE_ALLOWANCE
from gpujobs.domain.effects import Decision, Launch, Outcome, SignalCheckpoint, ignore, live_instances
from gpujobs.domain.job import HistoryEntry, Job, Market
from gpujobs.domain.spec import Capacity, CheckpointMode
from gpujobs.domain.states import JobState, Reason

GOODPUT_GOAL = 0.95
CHANGEOVER = BOOT_ALLOWANCE + RESTORE_ALLOWANCE
"""Paid time without progress that one interruption costs: the replacement's boot and restore."""
VOLATILE_GAP = CHANGEOVER / (1 - GOODPUT_GOAL)
"""The mean time between interruptions below which spot cannot hold the goal (3 hours)."""
VOLATILE_COUNT = 3
VOLATILE_WINDOW = (VOLATILE_COUNT - 1) * VOLATILE_GAP
"""`VOLATILE_COUNT` interruptions within this (6 hours) are gaps of `VOLATILE_GAP` or less."""
MAX_WAIT = timedelta(hours=24)
"""The longest wait on on-demand before the next try of spot."""
BACKOFF_MEMORY = 2 * MAX_WAIT
"""Failed returns older than twice the longest wait no longer lengthen the next one."""
MAX_DOUBLINGS = 12
"""Enough to reach `MAX_WAIT` from the shortest first wait (`MOVE_RETRY`); bounds the arithmetic."""
SPOT_RECLAIMS = frozenset({Reason.SPOT_INTERRUPTION, Reason.INSTANCE_LOST})
"""Why a running attempt became INTERRUPTED when spot took it (a warning, or instances gone)."""
MOVE_RETRY = timedelta(minutes=10)
"""After a move found no room on its market (its attempt trained on), the next try: each try costs a
checkpoint and a ladder walk, never the running attempt."""


def is_spot_reclaim(entry: HistoryEntry) -> bool:
    """The transition says spot took (a node of) the running gang: the attempt's end, or one node
    whose replacement joins the survivors (`domain.regroup`). A regroup that then finds no room is
    the same reclaim, not another."""
    if entry.target is JobState.INTERRUPTED:
        return entry.reason in SPOT_RECLAIMS
    return entry.target is JobState.RUNNING and entry.reason is Reason.NODE_RECLAIMED


def spot_interruptions(job: Job) -> list[datetime]:
    """When spot took the job's running attempts, oldest first (moves are not interruptions), read
    from its history: the record keeps its newest 40 transitions (three or so per interruption) but
    only four finished attempts, which a job moving between markets goes through in an hour."""
    return [e.at for e in job.history if is_spot_reclaim(e)]


def volatile(job: Job, *, now: datetime) -> bool:
    """Spot has reclaimed this `spot-first` job without a deadline `VOLATILE_COUNT` times within
    `VOLATILE_WINDOW`: its launches go to on-demand first."""
    spec = job.require_spec()
    if spec.capacity is not Capacity.SPOT_FIRST or spec.deadline is not None:
        return False
    recent = [t for t in spot_interruptions(job) if now - t <= VOLATILE_WINDOW]
    return len(recent) >= VOLATILE_COUNT


def return_wait(job: Job, *, now: datetime) -> tuple[datetime, timedelta]:
    """When the on-demand attempt's wait for its next try of spot began, and how long it is (see the
    module docstring); the try is due once `now` is that long past the start."""
    attempt = job.current_attempt
    assert attempt is not None
    failed = min(failed_returns(job, now=now), MAX_DOUBLINGS)
    volatile_stay = failed > 0 or volatile(job, now=attempt.started_at)
    first = VOLATILE_WINDOW if volatile_stay else probe_every(job)
    refused = [
        e.at
        for e in job.history
        if e.reason is Reason.BACK_TO_SPOT and e.source is JobState.LAUNCHING and e.at >= attempt.started_at
    ]
    probing = min(VOLATILE_GAP, probe_every(job) * (1 << min(len(refused), MAX_DOUBLINGS)))
    wait = (probing if refused else first) * (1 << failed)
    return max([attempt.started_at, *refused]), min(MAX_WAIT, wait)


def failed_returns(job: Job, *, now: datetime) -> int:
    """Returns to spot within `BACKOFF_MEMORY` whose spot attempt was reclaimed within `VOLATILE_GAP`,
    read from the history (the record keeps its newest 40 transitions)."""
    history, count = job.history, 0
    for i, entry in enumerate(history):
        if entry.reason is not Reason.BACK_TO_SPOT or entry.target is not JobState.INTERRUPTED:
            continue
        if now - entry.at > BACKOFF_MEMORY:
            continue
        landed = next((e for e in history[i + 1 :] if e.source is JobState.LAUNCHING), None)
        if landed is None or landed.reason is not Reason.INSTANCES_LAUNCHED:
            continue  # no spot room: the on-demand attempt trained on, no return
        reclaimed = next((e for e in history[i + 1 :] if is_spot_reclaim(e)), None)
        count += reclaimed is not None and reclaimed.at - landed.at < VOLATILE_GAP
    return count


def moving_back_to_spot(job: Job) -> bool:
    """The job's launch replaces an on-demand attempt that was moved back to spot and still trains:
    its replacement goes to spot only (with no spot room the moved attempt trains on)."""
    back = {JobState.INTERRUPTED: 1, JobState.LAUNCHING: 2}.get(job.state)
    if back is None or len(job.attempts) < back:
        return False
    moved = job.attempts[-back]
    if not moved.moved or moved.is_over:
        return False
    into = next((e for e in reversed(job.history) if e.target is JobState.INTERRUPTED), None)
    return into is not None and into.reason is Reason.BACK_TO_SPOT


def back_to_spot(job: Job, *, now: datetime, allowed: Collection[Market]) -> Decision:
    """Move a `spot-first` job without a deadline from on-demand back to spot once its next try is due
    (`return_wait`, see the module docstring); `allowed`: what a launch may use now apart from this
    (the budget's policy)."""
    spec, attempt = job.require_spec(), job.current_attempt
    if job.state is not JobState.RUNNING or job.stop_request is not None or attempt is None or attempt.is_over:
        return ignore(Outcome.NOT_RUNNING)
    if spec.capacity is not Capacity.SPOT_FIRST or spec.deadline is not None:
        return ignore(Outcome.NOTHING_TO_DECIDE)
    if attempt.market is not Market.ON_DEMAND or attempt.interrupted_at is not None or not attempt.instance_ids:
        return ignore(Outcome.NOTHING_TO_DECIDE)
    if spec.checkpoint is CheckpointMode.NONE:
        return ignore(Outcome.NOTHING_TO_DECIDE, "a move would restart a job that saves nothing from scratch")
    if Market.SPOT not in allowed:
        return ignore(Outcome.NOTHING_TO_DECIDE, "a launch may not use spot now")
    last = max(spot_interruptions(job), default=None)
    if last is not None and now - last < VOLATILE_GAP:
        return ignore(Outcome.NOTHING_TO_DECIDE, "spot reclaimed the job less than 3 hours ago")
    if volatile(job, now=now):  # e.g. three reclaims at one instant, exactly 6 h ago: still within the window
        return ignore(Outcome.NOTHING_TO_DECIDE, "spot is still volatile for the job")
    since, wait = return_wait(job, now=now)
    if now - since < wait:
        return ignore(Outcome.NOTHING_TO_DECIDE, f"the next try of spot is due {_hours(wait - (now - since))} from now")
    detail = f"on on-demand for {_hours(now - attempt.started_at)}: checkpoint and move back to spot"
    marked = job.with_attempt(attempt.model_copy(update={"interrupted_at": now, "moved": True}), now=now)
    moved = marked.transition(JobState.INTERRUPTED, Reason.BACK_TO_SPOT, now=now, detail=detail)
    signal = SignalCheckpoint(live_instances(attempt), attempt.container_name(job.job_id))
    return Decision(Outcome.MARKET_CHANGED, moved, (signal, Launch(job.job_id)), detail, {"BackToSpotMoves": 1})


def probe_every(job: Job) -> timedelta:
    """How often a job that went to on-demand for want of spot room looks for spot again: each try
    asks the trainer for one checkpoint, so no more often than its own checkpoint interval (and
    never more often than `MOVE_RETRY`)."""
    return max(MOVE_RETRY, timedelta(minutes=job.require_spec().checkpoint_every_minutes))


def _hours(span: timedelta) -> str:
    return f"{span.total_seconds() / 3600:.1f} h"


def last_move_without_room(job: Job, reason: Reason) -> datetime | None:
    """When a move for `reason` last found no room and its attempt trained on (LAUNCHING -> RUNNING)."""
    return max(
        (
            e.at
            for e in job.history
            if e.reason is reason and e.source is JobState.LAUNCHING and e.target is JobState.RUNNING
        ),
        default=None,
    )


def move_reason(job: Job) -> Reason:
    """Why a moved attempt was moved: its deadline, or spot calm again."""
    return Reason.DEADLINE_MARKET if job.require_spec().deadline is not None else Reason.BACK_TO_SPOT


def may_change_market(job: Job) -> bool:
    """A running job some rule may move to the other market: one with a deadline, or a `spot-first`
    one on on-demand (the reconciler asks only these, on every tick)."""
    spec, attempt = job.require_spec(), job.current_attempt
    if spec.deadline is not None:
        return True
    return spec.capacity is Capacity.SPOT_FIRST and attempt is not None and attempt.market is Market.ON_DEMAND
