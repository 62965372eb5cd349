"""Spot pools chosen by evidence: which zone of a type a launch tries first.

A spot pool is one (instance type, zone). The evidence is the stack's own: every spot reclaim any of
its jobs met, recorded as the replacement's launch begins (`service.launcher`), plus the job's own
record. A reclaim weighs 1 when it happens and half as much every `HALF_LIFE`, the span over which
`domain.volatility` judges spot (6 hours): a pool reclaimed twice this morning is riskier than one
reclaimed once last night, and evidence older than `HORIZON` (where a reclaim weighs under 1/256)
is not read at all.

The ladder keeps its shape: market first (spot before on-demand), then the spec's instance types in
the user's order, then zones. Evidence reorders only what nothing else orders:

- within a type, zones go from the least to the most reclaimed (ties keep the subnets' order), so a
  replacement does not go back to the zone that has just been reclaimed three times while a quiet
  one has room;
- a spot pool reclaimed in the last `RECENT` minutes (the job's own just-reclaimed pool too) goes
  after every other rung, on-demand's included, whatever its type: drops come together (a capacity crunch takes
  a pool's instances one job after another within minutes), and a replacement launched into such a
  pool boots for nine minutes only to be reclaimed again.

Between zones the stack has no reclaims in (or as many, to the nearest whole reclaim: one a day
old weighs 1/16), EC2's own spot placement score for the zone goes next, highest first: AWS's
forecast of spot capacity for the job's types and node count in that zone (1 to 10; a zone AWS did
not score counts as 0, and without scores the order is the subnets'). The stack's own reclaims come
before it because they are about this account's pools today; a score is advice for any account.

Nothing here is fitted to a trace: the half-life is the volatility rule's window and `RECENT` is
about three replacement boots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from gpujobs.domain.job import Job, Market
from gpujobs.domain.volatility import VOLATILE_WINDOW

HALF_LIFE = VOLATILE_WINDOW
HORIZON = 8 * HALF_LIFE
RECENT = timedelta(minutes=30)


class PoolRung(Protocol):
    """A rung of the ladder (`ladder.Rung`), as far as ranking needs it."""

    @property
    def instance_type(self) -> str: ...
    @property
    def zone(self) -> str: ...
    @property
    def market(self) -> Market: ...


R = TypeVar("R", bound=PoolRung)


@dataclass(frozen=True)
class Reclaim:
    """Spot took an instance of this pool back at `at` (one entry per job attempt: `key`)."""

    instance_type: str
    zone: str
    at: datetime
    key: str = ""
    """Which job attempt met it (`job_id#attempt`): recording the same reclaim twice counts it once."""

    @property
    def pool(self) -> tuple[str, str]:
        return (self.instance_type, self.zone)


def reclaims_of(job: Job) -> list[Reclaim]:
    """The spot reclaims the job's record shows (moves are not reclaims): its attempts' and its
    gangs' newest node reclaims (`domain.regroup`). An attempt a node's failed GPU check or hardware
    fault ended (`Attempt.unhealthy`) scores its pool down like a reclaim: the relaunch tries the
    pool's other zones first, and the stack's other spot launches learn of it too. A slow interconnect
    (`Attempt.slow_interconnect`, exit 123) never does: the figure is the job's container's claim, and
    one job's image must not steer every team's spot placement."""
    found = []
    for a in job.attempts:
        if a.market is not Market.SPOT or a.instance_type is None or a.zone is None:
            continue
        if a.unhealthy and a.ended_at is not None:
            found.append(Reclaim(a.instance_type, a.zone, a.ended_at, f"{job.job_id}#{a.number}unhealthy"))
        if a.interrupted_at is not None and not a.moved:
            found.append(Reclaim(a.instance_type, a.zone, a.interrupted_at, f"{job.job_id}#{a.number}"))
        if a.regroup is not None and a.regroup.at != a.interrupted_at:
            key = f"{job.job_id}#{a.number}g{a.regroup.generation}"
            found.append(Reclaim(a.instance_type, a.zone, a.regroup.at, key))
    return found


def risk(reclaims: Iterable[Reclaim], *, now: datetime) -> dict[tuple[str, str], float]:
    """Each pool's decayed count of reclaims within `HORIZON` (a reclaim recorded twice counts once)."""
    unique: dict[tuple[tuple[str, str], str], Reclaim] = {}
    for r in reclaims:
        unique.setdefault((r.pool, r.key or f"@{r.at.isoformat()}"), r)
    weights: dict[tuple[str, str], float] = {}
    for r in unique.values():
        age = max(timedelta(0), now - r.at)
        if age <= HORIZON:
            weights[r.pool] = weights.get(r.pool, 0.0) + 0.5 ** (age / HALF_LIFE)
    return weights


def recently_reclaimed(reclaims: Iterable[Reclaim], *, now: datetime) -> set[tuple[str, str]]:
    return {r.pool for r in reclaims if timedelta(0) <= now - r.at <= RECENT}


def rank(
    rungs: Sequence[R], reclaims: Sequence[Reclaim], *, now: datetime, zone_scores: Mapping[str, int] | None = None
) -> list[R]:
    """The ladder's rungs with each type's spot zones in order of evidence (the stack's reclaims,
    then `zone_scores`: zone -> EC2's spot placement score) and recently reclaimed spot pools after
    every other rung (see the module docstring). Order is otherwise kept."""
    weights = risk(reclaims, now=now)
    recent = recently_reclaimed(reclaims, now=now)
    scores = zone_scores or {}
    type_rank = {t: i for i, t in enumerate(dict.fromkeys(r.instance_type for r in rungs))}
    market_rank = {m: i for i, m in enumerate(dict.fromkeys(r.market for r in rungs))}

    def key(numbered: tuple[int, R]) -> tuple[int, int, int, int, int, float, int]:
        position, rung = numbered
        pool = (rung.instance_type, rung.zone)
        spot = rung.market is Market.SPOT
        late = 1 if spot and pool in recent else 0
        weight = weights.get(pool, 0.0) if spot else 0.0
        score = scores.get(rung.zone, 0) if spot else 0
        return (late, market_rank[rung.market], type_rank[rung.instance_type], round(weight), -score, weight, position)

    return [rung for _, rung in sorted(enumerate(rungs), key=key)]
