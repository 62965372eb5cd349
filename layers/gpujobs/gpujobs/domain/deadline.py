"""Deadlines: which market the next launch may use so that a job finishes in time, cheaply.

A Uniform-Progress-like rule (Can't Be Late, NSDI '24; `shared/reference/goodput-anchors.md` §3),
decided only at a launch, from the record: the work left is the spec's `expected_hours` less the
share of `total_steps` the newest committed checkpoint holds (what a replacement resumes from), and
one changeover `d` is what a relaunch costs at worst: the boot, the restore and one checkpoint
interval of work (a reclaim whose warning-time save did not commit loses up to that).

- Late (the time left no longer covers the work and two changeovers): on-demand only. Two, as the
  paper's safety net: one for the launch now, one for a reclaim that may still come on spot.
- Behind the uniform-progress line (`done / expected < elapsed / deadline`): spot where there is
  room, else on-demand in the same ladder walk (today's `spot-first`).
- Ahead of it: spot only; with no room the job waits, and its retry is never later than the moment
  it would become late (`latest_retry`).

A running attempt moves (`move_market`: checkpoint now, replace, as a reclaim does) in two cases
only. A spot attempt keeps its slack while it trains (work and time run down together) and a
warning's save leaves its replacement a boot and a restore to pay, so it leaves spot only when its
heartbeats show it training too slowly to finish and survive one more reclaim (`must_leave_spot`).
An on-demand attempt goes back to spot only when it is ahead of uniform progress by two
changeovers, the paper's hysteresis, and the slack covers two more (`may_return_to_spot`): then
each hour on spot saves two thirds of the price for a changeover's risk. A spec without a deadline
decides nothing here: today's `capacity` rules apply unchanged.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from gpujobs.domain.effects import Decision, Launch, Outcome, SignalCheckpoint, ignore, live_instances
from gpujobs.domain.job import BOOT_ALLOWANCE, RESTORE_ALLOWANCE, Job, Market
from gpujobs.domain.spec import CheckpointMode, Deadline
from gpujobs.domain.states import JobState, Reason
from gpujobs.domain.volatility import MOVE_RETRY, last_move_without_room


class DeadlineMarkets(StrEnum):
    """The markets a deadline allows the next launch."""

    SPOT_ONLY = "spot-only"
    """Ahead of schedule: wait for spot rather than pay for on-demand."""
    SPOT_FIRST = "spot-first"
    """Behind schedule: spot where there is room, else on-demand at once."""
    ON_DEMAND = "on-demand"
    """Late: the slack no longer covers a reclaim on spot."""


@dataclass(frozen=True)
class Slack:
    """A job's standing against its deadline at one moment."""

    deadline_at: datetime
    time_left: timedelta
    work_left: timedelta
    changeover: timedelta

    @property
    def slack(self) -> timedelta:
        """Time to spare once the work left and one changeover are done (negative: late already)."""
        return self.time_left - self.work_left - self.changeover


def deadline_at(job: Job) -> datetime | None:
    spec = job.require_spec()
    return None if spec.deadline is None else job.created_at + timedelta(hours=spec.deadline.hours)


def changeover(job: Job) -> timedelta:
    """What one relaunch costs at worst: boot, restore and one checkpoint interval."""
    return BOOT_ALLOWANCE + RESTORE_ALLOWANCE + timedelta(minutes=job.require_spec().checkpoint_every_minutes)


def work_left(deadline: Deadline, *, step: int | None) -> timedelta:
    """The expected training time still to do once `step` of `total_steps` is done."""
    done = min(1.0, (step or 0) / deadline.total_steps)
    return timedelta(hours=deadline.expected_hours * (1.0 - done))


def slack_of(job: Job, *, now: datetime, step: int | None = None) -> Slack | None:
    """The job's slack from its committed checkpoint (or `step`, a newer heartbeat's: the running
    attempt's progress counts too); None without a deadline. A job whose script counts no steps for
    us (`directory`, `none`) is measured in training time instead (`time_trained`)."""
    spec = job.require_spec()
    due = deadline_at(job)
    if spec.deadline is None or due is None:
        return None
    if spec.checkpoint is CheckpointMode.GPUJOBS:
        left = work_left(spec.deadline, step=max(step or 0, job.checkpoint_step or 0))
    else:
        expected = timedelta(hours=spec.deadline.expected_hours)
        left = max(timedelta(0), expected - time_trained(job, running=step is not None))
    return Slack(deadline_at=due, time_left=due - now, work_left=left, changeover=changeover(job))


def time_trained(job: Job, *, running: bool) -> timedelta:
    """The training time a `directory` or `none` job has to show: what its newest sync keeps (each
    attempt from its boot and restore to its last committed sync, since each resumes from the sync
    before), and with `running`, the current attempt's time since then up to its latest heartbeat
    (the launcher's own, once a minute; a `directory` job saves it on the SIGTERM a move sends). A
    `none` job keeps nothing across attempts: only the running attempt's time counts."""
    spec, current = job.require_spec(), job.current_attempt
    kept = timedelta(0)
    if spec.checkpoint is CheckpointMode.DIRECTORY:  # the attempts the record let go count too
        kept = job.retired.trained + sum((attempt.trained_to_sync for attempt in job.attempts), timedelta(0))
    if running and current is not None and not current.is_over and current.last_heartbeat_at is not None:
        since = current.trains_from
        if spec.checkpoint is CheckpointMode.DIRECTORY and current.checkpoint_at is not None:
            since = max(since, current.checkpoint_at)
        kept += max(timedelta(0), current.last_heartbeat_at - since)
    return kept


def launch_markets(job: Job, *, now: datetime) -> DeadlineMarkets | None:
    """The markets the next launch may use under the job's deadline; None without one."""
    spec = job.require_spec()
    standing = slack_of(job, now=now)
    if spec.deadline is None or standing is None:
        return None
    if standing.slack <= standing.changeover:
        return DeadlineMarkets.ON_DEMAND
    behind = _lead(job, spec.deadline, standing, now=now) < timedelta(0)
    return DeadlineMarkets.SPOT_FIRST if behind else DeadlineMarkets.SPOT_ONLY


def _lead(job: Job, deadline: Deadline, standing: Slack, *, now: datetime) -> timedelta:
    """How far ahead of uniform progress (`expected_hours` spread evenly to the deadline) the job is,
    in time on that schedule; negative when behind."""
    done = 1.0 - standing.work_left / timedelta(hours=deadline.expected_hours)
    return done * timedelta(hours=deadline.hours) - (now - job.created_at)


def latest_retry(job: Job, proposed: datetime) -> datetime:
    """A retry after no capacity, no later than the moment the job would have to go on-demand."""
    spec = job.require_spec()
    due = deadline_at(job)
    if spec.deadline is None or due is None:
        return proposed
    standing = slack_of(job, now=due)
    assert standing is not None
    late_at = due - standing.work_left - 2 * standing.changeover
    return min(proposed, late_at)


def must_leave_spot(job: Job, *, now: datetime) -> bool:
    """The running spot attempt's heartbeats show it cannot both finish and survive one more
    reclaim before the deadline: checkpoint it and go on to on-demand now."""
    attempt = job.current_attempt
    if attempt is None or attempt.is_over or attempt.market is not Market.SPOT or attempt.interrupted_at:
        return False
    standing = slack_of(job, now=now, step=attempt.heartbeat_step)
    return standing is not None and standing.slack <= timedelta(0)


def may_return_to_spot(job: Job, *, now: datetime) -> bool:
    """The running on-demand attempt is two changeovers ahead of uniform progress and has two
    changeovers of slack to spare: spot again, and on-demand after a reclaim still makes it."""
    spec, attempt = job.require_spec(), job.current_attempt
    if attempt is None or attempt.is_over or attempt.market is not Market.ON_DEMAND or attempt.interrupted_at:
        return False
    standing = slack_of(job, now=now, step=attempt.heartbeat_step)
    if spec.deadline is None or standing is None:
        return False
    margin = 2 * standing.changeover
    return standing.slack > margin and _lead(job, spec.deadline, standing, now=now) >= margin


def move_market(job: Job, *, now: datetime, allowed: Collection[Market]) -> Decision:
    """Checkpoint the running attempt and replace it on the market the deadline needs, make before
    break: the attempt is marked `moved` and trains on until its replacement's gang is up; the
    reconciler takes its instances only then, after the warning window (`gangs.overdue_survivors`),
    and the replacement waits for that end to resume. Not counted as an interruption (no spot pool
    took it).

    `allowed` is what a launch may use now apart from the deadline (`ladder.movable_markets`: the
    spec past its interruptions, the budget's policy). A move to a market outside it would launch
    the replacement on the market it left, tick after tick: there is no move then, and the attempt
    trains on where it is."""
    attempt = job.current_attempt
    if job.state is not JobState.RUNNING or job.stop_request is not None or attempt is None:
        return ignore(Outcome.NOT_RUNNING)
    if job.require_spec().checkpoint is CheckpointMode.NONE:
        return ignore(Outcome.NOTHING_TO_DECIDE, "a move would restart a job that saves nothing from scratch")
    if attempt.waits_for_replacement:
        return ignore(Outcome.NOTHING_TO_DECIDE, "the gang waits for a node's replacement (`domain.regroup`)")
    if must_leave_spot(job, now=now):
        target = Market.ON_DEMAND
    elif may_return_to_spot(job, now=now):
        target = Market.SPOT
    else:
        return ignore(Outcome.NOTHING_TO_DECIDE)
    if target not in allowed:
        return ignore(Outcome.NOTHING_TO_DECIDE, f"the deadline wants {target.value}, which a launch may not use now")
    refused = last_move_without_room(job, Reason.DEADLINE_MARKET)
    if refused is not None and now - refused < MOVE_RETRY:
        return ignore(Outcome.NOTHING_TO_DECIDE, f"the last move found no room on {target.value}; retry later")
    standing = slack_of(job, now=now, step=attempt.heartbeat_step)
    assert standing is not None
    detail = f"deadline slack {standing.slack.total_seconds() / 3600:.1f} h: checkpoint and move to {target.value}"
    marked = job.with_attempt(attempt.model_copy(update={"interrupted_at": now, "moved": True}), now=now)
    moved = marked.transition(JobState.INTERRUPTED, Reason.DEADLINE_MARKET, now=now, detail=detail)
    signal = SignalCheckpoint(live_instances(attempt), attempt.container_name(job.job_id))
    return Decision(Outcome.MARKET_CHANGED, moved, (signal, Launch(job.job_id)), detail, {"DeadlineMoves": 1})
