"""What a job has used so far: the runtime and cost its caps are checked against.

Pure arithmetic over the job's attempts. Prices come in as an argument, one hourly price per pool
the job was billed in (`billed_pools`), so the caller decides where prices come from and looks
each pool up once.

A cap must err high, never low: a type missing from the price table (a new size, a table not yet
refreshed) counts at the highest known price of its family, else at the highest known price of
all (`price_erring_high`), never at $0, which would let the job run forever under its cap. Given
the catalog's sizes, each known price is first scaled up by how many times the missing type holds
what the known type holds (vCPUs, memory, GPUs or GPU memory, whichever is most): the highest
known price alone errs low for a bigger size of a family priced only in a small one (g6e.12xlarge
holds 12 times the vCPUs of g6e.xlarge) and for a newer family (p6-b200.48xlarge holds 2.2 times
the GPU memory of p5.48xlarge, the dearest type priced). The scaled answer is an upper estimate,
at times well above the real price; a cap over an unpriced type is refused at submit anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpujobs.domain.job import Attempt, Job, Market


@dataclass(frozen=True)
class BilledPool:
    """Where an attempt's instances ran, as far as a price depends on it."""

    instance_type: str
    market: Market
    zone: str | None


def runtime_of(job: Job, now: datetime) -> timedelta:
    """Time the job has held instances, over all its attempts (retired ones included)."""
    total = job.retired.runtime
    for attempt in job.attempts:
        if attempt.instance_ids:
            total += job.held_until(attempt, now) - attempt.started_at
    return total


def billed_pools(job: Job) -> set[BilledPool]:
    """The pools the job's attempts held instances in (retired ones included): the prices `cost_of` needs."""
    retired = {BilledPool(u.instance_type, u.market, u.zone) for u in job.retired.usage if u.instance_type}
    return retired | {pool for attempt in job.attempts if (pool := _pool_of(attempt)) is not None}


def cost_of(job: Job, now: datetime, hourly_usd: Mapping[BilledPool, float | None]) -> float:
    """Instance-hours times the hourly price of each attempt's pool.

    A pool missing from `hourly_usd` counts as zero here, so callers price every pool of
    `billed_pools`, erring high (`price_erring_high`) where a price is unknown. An attempt without a
    recorded market was launched on demand.
    """
    total = sum(
        usage.instance_seconds
        / 3600
        * (hourly_usd.get(BilledPool(usage.instance_type, usage.market, usage.zone)) or 0.0)
        for usage in job.retired.usage
    )
    for attempt in job.attempts:
        pool = _pool_of(attempt)
        if pool is None:
            continue
        hours = (job.held_until(attempt, now) - attempt.started_at).total_seconds() / 3600
        total += hours * len(attempt.instance_ids) * (hourly_usd.get(pool) or 0.0)
    return total


class UnpricedError(LookupError):
    """No price is known at all, so nothing can stand in for a missing one."""


def instance_family(instance_type: str) -> str:
    """`p5` for `p5.48xlarge` (and `p5e` for `p5e.48xlarge`, a family of its own)."""
    return instance_type.partition(".")[0]


@dataclass(frozen=True)
class InstanceSize:
    """What an instance type holds, as far as its price grows with it (the catalog's facts)."""

    vcpus: int
    memory_mib: int
    gpus: int = 0
    gpu_memory_mib: int = 0

    def times(self, other: InstanceSize) -> float:
        """How many times `other` this holds, in whatever it holds most of relative to `other` (at least 1)."""
        pairs = (
            (self.vcpus, other.vcpus),
            (self.memory_mib, other.memory_mib),
            (self.gpus, other.gpus),
            (self.gpu_memory_mib, other.gpu_memory_mib),
        )
        return max([1.0, *(mine / theirs for mine, theirs in pairs if theirs > 0)])


def price_erring_high(
    instance_type: str, known: Mapping[str, float], *, sizes: Mapping[str, InstanceSize] | None = None
) -> float:
    """The known price of the type; for a type missing from `known`, the highest known price of its
    family, else the highest known price of all, each scaled up by `InstanceSize.times` where `sizes`
    describes both types. UnpricedError when `known` is empty."""
    if instance_type in known:
        return known[instance_type]
    family = instance_family(instance_type)
    kin = {name: price for name, price in known.items() if instance_family(name) == family} or known
    if not kin:
        raise UnpricedError(f"no price is known for {instance_type}, nor for any other type")
    sizes = sizes or {}
    size = sizes.get(instance_type)
    if size is None:
        return max(kin.values())
    return max(price * (size.times(sizes[name]) if name in sizes else 1.0) for name, price in kin.items())


def _pool_of(attempt: Attempt) -> BilledPool | None:
    if not attempt.instance_ids or attempt.instance_type is None:
        return None
    return BilledPool(instance_type=attempt.instance_type, market=attempt.market or Market.ON_DEMAND, zone=attempt.zone)


@dataclass(frozen=True)
class GpuHours:
    """GPU-hours a job paid for, and the part whose work was kept (`Attempt.useful_instance_seconds`)."""

    paid: float
    useful: float


def gpu_hours_of(job: Job, now: datetime, gpus: Mapping[str, int], *, default_gpus: int) -> GpuHours:
    """Instance-hours times each type's GPU count (`default_gpus` for a type missing from `gpus`):
    paid counts every GPU of every instance held, useful only the time whose work was kept."""

    def per_instance(instance_type: str) -> int:
        return gpus.get(instance_type, default_gpus)

    paid = sum(u.instance_seconds * per_instance(u.instance_type) for u in job.retired.usage)
    useful = sum(u.useful_instance_seconds * per_instance(u.instance_type) for u in job.retired.usage)
    for attempt in job.attempts:
        if attempt.instance_ids and attempt.instance_type is not None:
            held = (job.held_until(attempt, now) - attempt.started_at).total_seconds() * len(attempt.instance_ids)
            paid += held * per_instance(attempt.instance_type)
            useful += attempt.useful_instance_seconds * per_instance(attempt.instance_type)
    return GpuHours(paid=paid / 3600, useful=useful / 3600)
