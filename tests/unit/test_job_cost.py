"""What a job has used: runtime and cost over its attempts, the numbers its caps are checked against."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpujobs.domain.cost import BilledPool, billed_pools, cost_of, runtime_of
from gpujobs.domain.job import Attempt, Job, Market
from gpujobs.domain.states import JobState

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPOT_A = BilledPool(instance_type="g5.xlarge", market=Market.SPOT, zone="us-east-1a")
ON_DEMAND_B = BilledPool(instance_type="g5.xlarge", market=Market.ON_DEMAND, zone="us-east-1b")


def job(*attempts: Attempt) -> Job:
    return Job(job_id="j-1", state=JobState.RUNNING, created_at=T0, updated_at=T0, attempts=attempts)


def attempt(
    number: int,
    *,
    hours: float,
    nodes: int,
    ended: bool,
    instance_type: str,
    zone: str,
    market: Market | None = None,
) -> Attempt:
    start = T0 + timedelta(hours=10 * (number - 1))
    return Attempt(
        number=number,
        started_at=start,
        ended_at=start + timedelta(hours=hours) if ended else None,
        instance_ids=tuple(f"i-{number}-{n}" for n in range(nodes)),
        instance_type=instance_type,
        zone=zone,
        market=market,
    )


def test_a_job_costs_its_instance_hours_at_each_attempts_price() -> None:
    # Given a spot attempt of 2 nodes that ran 2 h and ended, then an on-demand attempt still running
    first = attempt(1, hours=2, nodes=2, ended=True, instance_type="g5.xlarge", market=Market.SPOT, zone="us-east-1a")
    second = attempt(2, hours=0, nodes=1, ended=False, instance_type="g5.xlarge", zone="us-east-1b")
    now = second.started_at + timedelta(hours=3)

    # Then the pools to price are the two it ran in (no market recorded means on demand)
    assert billed_pools(job(first, second)) == {SPOT_A, ON_DEMAND_B}
    # And it cost 2 nodes x 2 h x $0.50 + 1 node x 3 h x $1.00, over 5 h of holding instances
    assert cost_of(job(first, second), now, {SPOT_A: 0.5, ON_DEMAND_B: 1.0}) == pytest.approx(5.0)
    assert runtime_of(job(first, second), now) == timedelta(hours=5)


def test_an_attempt_without_instances_or_a_price_costs_nothing() -> None:
    refused = Attempt(number=1, started_at=T0, ended_at=T0 + timedelta(minutes=1))
    unpriced = attempt(2, hours=4, nodes=1, ended=True, instance_type="x99.mega", market=Market.SPOT, zone="z")

    assert billed_pools(job(refused)) == set()
    assert cost_of(job(refused, unpriced), T0 + timedelta(days=1), {}) == 0.0
    assert runtime_of(job(refused, unpriced), T0 + timedelta(days=1)) == timedelta(hours=4)
