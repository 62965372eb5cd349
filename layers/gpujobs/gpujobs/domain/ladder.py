"""The capacity ladder: which (instance type, zone, market) rungs to try, in which order.

Pure decisions only. The launcher walks the rungs in order and stops at the first that launches.
Spot comes first when the spec allows it. A `spot` job that has been interrupted past
`max_interruptions` times fails; a `spot-first` job is never given up for its interruptions: while
spot reclaims it too often (`domain.volatility`) it launches on on-demand first, and it goes back to
spot once spot is calm. A job with a deadline narrows its `spot-first` markets to the ones
`domain.deadline` allows now; a move back to spot launches on spot only; a forecasted budget breach
removes on-demand rungs. Within a market, the spot pools are ordered by the stack's evidence
(`domain.pools`): each type's zones from the least reclaimed, and pools reclaimed minutes ago after
every other rung (the job's own just-reclaimed pool among them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from gpujobs.domain import pools
from gpujobs.domain.deadline import DeadlineMarkets, latest_retry, launch_markets
from gpujobs.domain.job import Job, Market
from gpujobs.domain.quotas import QUOTA_ERROR_CODES
from gpujobs.domain.spec import Capacity, JobSpec
from gpujobs.domain.states import WAITING_FOR_ROOM
from gpujobs.domain.volatility import moving_back_to_spot, volatile


@dataclass(frozen=True)
class Rung:
    instance_type: str
    subnet_id: str
    zone: str
    market: Market

    @property
    def pool(self) -> tuple[str, str, Market]:
        return (self.instance_type, self.zone, self.market)


@dataclass(frozen=True)
class SubnetZone:
    subnet_id: str
    zone: str


def markets_for(
    spec: JobSpec,
    *,
    interruptions: int,
    volatile: bool = False,
    spot_only: bool = False,
    deadline: DeadlineMarkets | None = None,
) -> list[Market]:
    """The markets a launch may use now, in order of preference; a budget's spot-only wins over a
    deadline and over volatility. `volatile`: spot has reclaimed this `spot-first` job too often
    lately (`domain.volatility`), so on-demand comes first, spot only when on-demand has no room."""
    if spec.capacity is Capacity.ON_DEMAND:
        markets = [Market.ON_DEMAND]
    elif spec.capacity is Capacity.SPOT:
        markets = [Market.SPOT] if interruptions <= spec.max_interruptions else []
    elif volatile:
        markets = [Market.ON_DEMAND, Market.SPOT]
    else:
        markets = [Market.SPOT, Market.ON_DEMAND]
    if deadline is DeadlineMarkets.ON_DEMAND and Market.ON_DEMAND in markets and not spot_only:
        markets = [Market.ON_DEMAND]
    elif deadline is DeadlineMarkets.SPOT_ONLY and Market.SPOT in markets:
        markets = [Market.SPOT]
    if spot_only:
        markets = [m for m in markets if m is Market.SPOT]
    return markets


def job_markets(job: Job, *, now: datetime, spot_only: bool = False) -> list[Market]:
    """The markets the job's next launch may use now: its spec, its deadline, how volatile spot has
    been for it, and a move back to spot (spot only: with no room its on-demand attempt trains on)."""
    spec = job.require_spec()
    markets = markets_for(
        spec,
        interruptions=job.interruptions,
        volatile=volatile(job, now=now),
        spot_only=spot_only,
        deadline=launch_markets(job, now=now),
    )
    if moving_back_to_spot(job):
        markets = [m for m in markets if m is Market.SPOT]
    return markets


def movable_markets(job: Job, *, spot_only: bool, hold: bool) -> list[Market]:
    """The markets a move may go to now: what the spec allows and the budget allows (spot only under
    a forecast, nothing under a hold); the rule that asks for the move (a deadline, calm spot) is
    left out here."""
    if hold:
        return []
    return markets_for(job.require_spec(), interruptions=job.interruptions, spot_only=spot_only)


def plan_ladder(
    spec: JobSpec,
    subnets: Sequence[SubnetZone],
    *,
    markets: Sequence[Market],
    reclaims: Sequence[pools.Reclaim] = (),
    now: datetime | None = None,
    zone_scores: Mapping[str, int] | None = None,
) -> list[Rung]:
    """Every rung to try: market-major (in `markets`' order), then the spec's type order, then zones;
    spot pools reordered by the evidence in `reclaims` as of `now` and EC2's placement scores of the
    zones (`domain.pools.rank`)."""
    rungs = [
        Rung(instance_type=t, subnet_id=s.subnet_id, zone=s.zone, market=m)
        for m in markets
        for t in spec.instance_types
        for s in subnets
    ]
    if (reclaims or zone_scores) and now is not None:
        rungs = pools.rank(rungs, reclaims, now=now, zone_scores=zone_scores)
    return rungs


class ErrorKind(StrEnum):
    NEXT_RUNG = "next-rung"
    """No capacity in this pool: try the next rung."""
    QUOTA = "quota"
    """A vCPU quota of the Region refused it (`domain.quotas`): try the next rung, and say which quota."""
    TRANSIENT = "transient"
    """Throttling or a service error: retry the same request later."""
    FATAL = "fatal"
    """A configuration error no rung will fix."""


CAPACITY_ERROR_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "SpotMaxPriceTooLow",
        "InstanceLimitExceeded",
        "Unsupported",
        "UnsupportedOperation",
        "InvalidParameterCombination",
        "InsufficientFreeAddressesInSubnet",
        "CapacityNotAvailable",
        "PlacementGroupLimitExceeded",
    }
)
PLACEMENT_GROUP_LIMIT_EXCEEDED = "PlacementGroupLimitExceeded"
"""500 placement groups per Region: no rung fixes it, but the groups of ended jobs being swept does."""
TRANSIENT_ERROR_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "InternalError",
        "ServiceUnavailable",
        "Unavailable",
    }
)


def classify_launch_error(code: str) -> ErrorKind:
    if code in QUOTA_ERROR_CODES:
        return ErrorKind.QUOTA
    if code in CAPACITY_ERROR_CODES:
        return ErrorKind.NEXT_RUNG
    if code in TRANSIENT_ERROR_CODES:
        return ErrorKind.TRANSIENT
    return ErrorKind.FATAL


RETRY_CAP_SECONDS = 300
"""The longest wait between two ladder walks of a job that finds no capacity, as SkyPilot's 5 min.
A longer cap (it was 30 min) relaunched a job 23 min after room came back on the goodput bench's
traces; a shorter one costs no Lambda invocation (the reconciler, which walks the ladders, runs
every minute anyway) and about 22 walks an hour per waiting job instead of 4, each a few refused
RunInstances calls and two conditional writes. The reconciler runs one at a time and stops launch
work 30 s before its timeout, replacements first, so however many jobs wait, their walks cannot
crowd out an interrupted job's replacement (README, "Goodput on real spot traces")."""


def next_try_delay(
    failures_in_a_row: int, *, jitter: float, base_seconds: float = 60, cap_seconds: float = RETRY_CAP_SECONDS
) -> timedelta:
    """Exponential backoff with full jitter for a job that found no capacity.

    `jitter` is a number in [0, 1) supplied by the caller, so the decision stays pure and testable.
    """
    ceiling = min(cap_seconds, base_seconds * 2 ** max(0, failures_in_a_row - 1))
    return timedelta(seconds=base_seconds / 2 + jitter * (ceiling - base_seconds / 2))


def next_try_at(job: Job, *, now: datetime, jitter: float) -> datetime:
    """When a job that found no capacity tries again: the backoff, but never after the moment its
    deadline needs on-demand (`deadline.latest_retry`)."""
    return latest_retry(job, now + next_try_delay(capacity_failures_in_a_row(job), jitter=jitter))


def capacity_failures_in_a_row(job: Job) -> int:
    count = 0
    for attempt in reversed(job.attempts):
        if attempt.end_reason not in WAITING_FOR_ROOM and attempt.ended_at is not None:
            return count
        count += 1
    return count + job.retired.no_capacity_in_a_row
