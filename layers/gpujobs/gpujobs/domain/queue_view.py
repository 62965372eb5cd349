"""What a user sees of the admission queue: each waiting job's place, why it waits, and when it
can start at the latest (`gpujobs queue`, `gpujobs status`).

The places are the admission plan's own order (`domain.admission.plan`), so the queue shown is the
one the reconciler follows. The estimate is a bound, not a forecast: it plays the plan forward
assuming every running job runs to its `max_runtime_minutes` (the latest it can end) and no job
goes ahead of the waiting ones; a job the plan does not reach within `ESTIMATED_EVENTS` ends has
none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpujobs.domain.admission import Blocked, plan
from gpujobs.domain.cost import runtime_of
from gpujobs.domain.job import Job
from gpujobs.domain.ledger import truth, waits

if TYPE_CHECKING:
    from gpujobs.domain.teams import TeamDirectory

ESTIMATED_EVENTS = 50
"""Ends of running jobs the estimate plays forward, at most."""
ESTIMATED_JOBS = 1_000
"""Waiting jobs the estimate follows, at most (the first in the queue)."""


@dataclass(frozen=True)
class Place:
    job: Job
    position: int
    """1 is the next to start, over every team."""
    in_team: int
    """1 is the next of its team."""
    why: str
    """Why it waits now (`Blocked`, with its numbers), or that it starts at the next admission round."""
    latest_start: datetime | None
    """The latest it can start (see the module docstring); None: not estimated."""


def places(waiting: Sequence[Job], holders: Sequence[Job], directory: TeamDirectory, now: datetime) -> list[Place]:
    """Every waiting job's place, in the order they would start."""
    queued = [job for job in waiting if waits(job)]
    decided = plan(queued, holders, truth([*holders, *queued]), directory, now)
    by_id = {job.job_id: job for job in queued}
    starts = latest_starts(queued, holders, directory, now)
    found: list[Place] = []
    in_team: dict[str, int] = {}
    admitted = {job_id for job_id, _ in decided.admit}
    for position, job_id in enumerate(decided.order, start=1):
        job = by_id[job_id]
        in_team[job.team] = in_team.get(job.team, 0) + 1
        waiting_now = decided.waiting.get(job_id)
        why = "starts at the next admission round" if job_id in admitted else _why(waiting_now)
        found.append(Place(job, position, in_team[job.team], why, starts.get(job_id)))
    return found


def _why(waiting: object) -> str:
    detail = getattr(waiting, "detail", None)
    return str(detail) if detail else Blocked.BEHIND.value


def latest_starts(
    waiting: Sequence[Job], holders: Sequence[Job], directory: TeamDirectory, now: datetime
) -> dict[str, datetime]:
    """The latest each waiting job can start: the plan played over the ends of running jobs."""
    pending = sorted((j for j in waiting if waits(j)), key=lambda j: j.created_at)[:ESTIMATED_JOBS]
    running = {job.job_id: job for job in holders}
    ends = {job.job_id: end for job in holders if (end := _latest_end(job, now)) is not None}
    starts: dict[str, datetime] = {}
    moment = now
    for _ in range(ESTIMATED_EVENTS + 1):
        if not pending:
            break
        held = list(running.values())
        decided = plan(pending, held, truth([*held, *pending]), directory, moment)
        admitted = {job_id for job_id, _ in decided.admit}
        for job in pending:
            if job.job_id in admitted:
                starts[job.job_id] = moment
                running[job.job_id] = _as_admitted(job, moment)
                ends[job.job_id] = moment + timedelta(minutes=job.require_spec().max_runtime_minutes)
        pending = [j for j in pending if j.job_id not in admitted]
        if not ends:
            break
        ended = min(ends, key=lambda job_id: (ends[job_id], job_id))
        moment = max(moment, ends.pop(ended))
        running.pop(ended, None)
    return starts


def _latest_end(job: Job, now: datetime) -> datetime | None:
    """When a holder ends at the latest: at its runtime cap, counted from its own runtime so far."""
    spec = job.spec
    if spec is None:
        return None
    left = timedelta(minutes=spec.max_runtime_minutes) - runtime_of(job, now)
    return now + max(left, timedelta(0))


def _as_admitted(job: Job, now: datetime) -> Job:
    from gpujobs.domain.values import Admission

    return job.model_copy(update={"admission": Admission(at=now), "attempts": ()})
