"""The capacity ladder: which (instance type, zone, market) rungs to try, in which order.

Pure decisions only. The launcher walks the rungs in order and stops at the first that launches.
Spot comes first when the spec allows it; a job that has been interrupted `max_interruptions`
times moves to on-demand (`spot-first`) or fails (`spot`); a job with a deadline narrows its
`spot-first` markets to the ones `domain.deadline` allows now; a replacement after an interruption
tries every other pool before the one that was just reclaimed; a forecasted budget breach removes
on-demand rungs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from gpujobs.domain.deadline import DeadlineMarkets, latest_retry
from gpujobs.domain.job import Job, Market
from gpujobs.domain.quotas import QUOTA_ERROR_CODES
from gpujobs.domain.spec import Capacity, JobSpec
from gpujobs.domain.states import WAITING_FOR_ROOM


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
    spec: JobSpec, *, interruptions: int, spot_only: bool = False, deadline: DeadlineMarkets | None = None
) -> list[Market]:
    """The markets a launch may use now, in order of preference; a budget's spot-only wins over a deadline."""
    if spec.capacity is Capacity.ON_DEMAND:
        markets = [Market.ON_DEMAND]
    elif spec.capacity is Capacity.SPOT:
        markets = [Market.SPOT] if interruptions <= spec.max_interruptions else []
    elif interruptions >= spec.max_interruptions:
        markets = [Market.ON_DEMAND]
    else:
        markets = [Market.SPOT, Market.ON_DEMAND]
    if deadline is DeadlineMarkets.ON_DEMAND and Market.ON_DEMAND in markets and not spot_only:
        markets = [Market.ON_DEMAND]
    elif deadline is DeadlineMarkets.SPOT_ONLY and Market.SPOT in markets:
        markets = [Market.SPOT]
    if spot_only:
        markets = [m for m in markets if m is Market.SPOT]
    return markets


def movable_markets(job: Job, *, spot_only: bool, hold: bool) -> list[Market]:
    """The markets a deadline's move may go to now: what the spec allows past its interruptions and
    the budget allows (spot only under a forecast, nothing under a hold); the deadline's own
    narrowing is what asks for the move, so it is left out here."""
    if hold:
        return []
    return markets_for(job.require_spec(), interruptions=job.interruptions, spot_only=spot_only)


def plan_ladder(
    spec: JobSpec,
    subnets: Sequence[SubnetZone],
    *,
    interruptions: int = 0,
    avoid_pool: tuple[str, str, Market] | None = None,
    spot_only: bool = False,
    deadline: DeadlineMarkets | None = None,
) -> list[Rung]:
    """Every rung to try: market-major (cheapest first), then the spec's type order, then zones."""
    rungs = [
        Rung(instance_type=t, subnet_id=s.subnet_id, zone=s.zone, market=m)
        for m in markets_for(spec, interruptions=interruptions, spot_only=spot_only, deadline=deadline)
        for t in spec.instance_types
        for s in subnets
    ]
    if avoid_pool is not None:
        # The pool that was just reclaimed is the one most likely to be reclaimed again.
        rungs = [r for r in rungs if r.pool != avoid_pool] + [r for r in rungs if r.pool == avoid_pool]
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
