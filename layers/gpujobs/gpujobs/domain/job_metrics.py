"""Metrics with dimensions, read off a change of a job's record: what the dashboard shows by pool and team.

The decisions' own metrics (`Decision.metrics`) are plain counts. Launches and capacity refusals
by pool, and cost by team, need dimensions, and each is visible as a difference between the record
read and the record written: an attempt that gained its instances was launched, a refusal appended
to an attempt's tries was a capacity refusal (or, by its code, a vCPU quota's), an attempt that gained its end stopped costing. So
they are derived here, once, from every write that passes `service.changes.change`, whichever
decision made it; a write retried after a lost race is derived from the record that won.

Cost is the attempt's instance-hours at the on-demand list price (erring high for an unlisted type,
as the caps do): an estimate, like every cost figure gpujobs shows, never a bill.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpujobs.domain.cost import UnpricedError, price_erring_high
from gpujobs.domain.job import Attempt, Job, LaunchTry, Market

LAUNCHES = "Launches"
CAPACITY_REFUSALS = "CapacityRefusals"
QUOTA_REFUSALS = "QuotaRefusals"
"""A vCPU quota's refusal (`domain.quotas`), by quota code: not counted as a capacity refusal."""
TEAM_COST = "EstimatedCostUsd"


@dataclass(frozen=True)
class JobMetric:
    name: str
    value: float
    dimensions: tuple[tuple[str, str], ...]


def metrics_of_change(before: Job | None, after: Job, *, hourly_usd: Mapping[str, float]) -> tuple[JobMetric, ...]:
    """The dimensioned metrics the write of `after` over `before` stands for."""
    found: list[JobMetric] = []
    for attempt in after.attempts:
        earlier = before.attempt(attempt.number) if before is not None else None
        found += _refusals(attempt, earlier)
        if attempt.instance_ids and not (earlier and earlier.instance_ids):
            found.append(JobMetric(LAUNCHES, 1.0, _pool(attempt.instance_type or "-", attempt.market)))
        if attempt.ended_at is not None and not (earlier and earlier.ended_at) and attempt.instance_ids:
            cost = _cost(attempt, hourly_usd)
            if cost is not None:
                found.append(JobMetric(TEAM_COST, cost, (("Team", after.team),)))
    return tuple(found)


def _refusals(attempt: Attempt, earlier: Attempt | None) -> list[JobMetric]:
    seen = (len(earlier.tries) + earlier.tries_dropped) if earlier else 0
    new = len(attempt.tries) + attempt.tries_dropped - seen
    fresh = attempt.tries[-new:] if new > 0 else ()
    if not fresh:
        return []
    from gpujobs.domain.quotas import is_quota_refusal  # launches only: no cold start loads the quota table

    return [
        JobMetric(QUOTA_REFUSALS, 1.0, (("Quota", _quota_label(t)),))
        if is_quota_refusal(t.error_code)
        else JobMetric(CAPACITY_REFUSALS, 1.0, _pool(t.instance_type, t.market))
        for t in fresh
    ]


def _quota_label(refused: LaunchTry) -> str:
    from gpujobs.domain.quotas import family, quota_for

    quota = quota_for(refused.instance_type, refused.market)
    return quota.code if quota else f"{family(refused.instance_type)} {refused.market.value}"


def _pool(instance_type: str, market: Market | None) -> tuple[tuple[str, str], ...]:
    return (("InstanceType", instance_type), ("Market", (market or Market.ON_DEMAND).value))


def _cost(attempt: Attempt, hourly_usd: Mapping[str, float]) -> float | None:
    assert attempt.ended_at is not None
    hours = (attempt.ended_at - attempt.started_at).total_seconds() / 3600 * len(attempt.instance_ids)
    try:
        return hours * price_erring_high(attempt.instance_type or "", hourly_usd)
    except UnpricedError:
        return None
