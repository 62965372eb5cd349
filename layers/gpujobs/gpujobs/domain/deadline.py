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

An attempt that runs is never preempted by this rule: an on-demand attempt keeps running when slack
returns, and the next launch (after a crash or a reclaim) goes back to spot. A running spot attempt
keeps its slack while it trains (work and time run down together), and the warning's save leaves
its replacement only a boot and a restore to pay; `must_leave_spot` says when an attempt's
heartbeats show it too slow to finish before the deadline even so. A spec without a deadline
decides nothing here: today's `capacity` rules apply unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from gpujobs.domain.job import Job, Market
from gpujobs.domain.spec import Deadline

BOOT_ALLOWANCE = timedelta(minutes=8)
"""Launch to training: p3/p4 provisioning (about 4 min) plus a multi-GB image pull (the goodput bench)."""
RESTORE_ALLOWANCE = timedelta(minutes=1)
"""Loading the newest checkpoint onto the GPUs."""


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


def work_left(deadline: Deadline, *, committed_step: int | None) -> timedelta:
    done = min(1.0, (committed_step or 0) / deadline.total_steps)
    return timedelta(hours=deadline.expected_hours * (1.0 - done))


def slack_of(job: Job, *, now: datetime, step: int | None = None) -> Slack | None:
    """The job's slack from its committed checkpoint (or `step`, a newer heartbeat's); None without a deadline."""
    spec = job.require_spec()
    due = deadline_at(job)
    if spec.deadline is None or due is None:
        return None
    progress = max(step or 0, job.checkpoint_step or 0)
    return Slack(
        deadline_at=due,
        time_left=due - now,
        work_left=work_left(spec.deadline, committed_step=progress),
        changeover=changeover(job),
    )


def launch_markets(job: Job, *, now: datetime) -> DeadlineMarkets | None:
    """The markets the next launch may use under the job's deadline; None without one."""
    spec = job.require_spec()
    standing = slack_of(job, now=now)
    if spec.deadline is None or standing is None:
        return None
    if standing.slack <= standing.changeover:
        return DeadlineMarkets.ON_DEMAND
    elapsed = now - job.created_at
    done = 1.0 - standing.work_left / timedelta(hours=spec.deadline.expected_hours)
    behind = done < elapsed / timedelta(hours=spec.deadline.hours)
    return DeadlineMarkets.SPOT_FIRST if behind else DeadlineMarkets.SPOT_ONLY


def latest_retry(job: Job, proposed: datetime) -> datetime:
    """A retry after no capacity, no later than the moment the job would have to go on-demand."""
    spec = job.require_spec()
    due = deadline_at(job)
    if spec.deadline is None or due is None:
        return proposed
    late_at = due - work_left(spec.deadline, committed_step=job.checkpoint_step) - 2 * changeover(job)
    return min(proposed, late_at)


def must_leave_spot(job: Job, *, now: datetime) -> bool:
    """The running spot attempt's heartbeats show it cannot both finish and survive one more
    reclaim before the deadline: checkpoint it and go on to on-demand now."""
    attempt = job.current_attempt
    if attempt is None or attempt.is_over or attempt.market is not Market.SPOT or attempt.interrupted_at:
        return False
    standing = slack_of(job, now=now, step=attempt.heartbeat_step)
    return standing is not None and standing.slack <= timedelta(0)
