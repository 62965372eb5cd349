"""A launch EC2's vCPU quota refuses is not "no capacity": the job waits and says which quota,
its value and how to raise it; a spot quota's refusal still launches on-demand where the spec allows."""

from __future__ import annotations

from gpujobs.domain.job import Market
from gpujobs.domain.job_metrics import CAPACITY_REFUSALS, QUOTA_REFUSALS, JobMetric
from gpujobs.domain.states import JobState
from gpujobs_fakes.memory import FakeServiceQuotas
from tests.service.conftest import World, spec

ZONES = ("us-east-1a", "us-east-1b")
RAISE = "aws service-quotas request-service-quota-increase --service-code ec2 --quota-code"


class Recorded:
    def __init__(self) -> None:
        self.metrics: list[JobMetric] = []

    def record(self, metrics: list[JobMetric]) -> None:
        self.metrics += metrics


def refuse_everywhere(world: World, code: str, *, market: str, types: tuple[str, ...] = ("g5.xlarge",)) -> None:
    world.compute.refuse.update({(t, z, market): code for t in types for z in ZONES})


def test_an_on_demand_quota_refusal_waits_naming_the_quota_its_value_and_the_command_that_raises_it(
    world: World,
) -> None:
    world.rewire(quotas=FakeServiceQuotas({"L-DB2E81BA": 0.0}))
    refuse_everywhere(world, "VcpuLimitExceeded", market="on-demand")

    job = world.submit(spec(capacity="on-demand", instance_types=["g5.xlarge"])).job

    assert job.state is JobState.QUEUED
    assert job.history[-1].reason == "quota-exceeded"
    assert "Running On-Demand G and VT instances (L-DB2E81BA) = 0 vCPUs" in job.status_detail
    assert f"{RAISE} L-DB2E81BA --desired-value" in job.status_detail
    assert "no capacity" not in job.status_detail
    assert job.next_try_at is not None
    assert job.next_try_at > world.clock.now()
    # One zone's refusal is the Region's: the other zone of the same type is not asked.
    assert [(c.instance_type, c.subnet.zone) for c in world.compute.calls] == [("g5.xlarge", "us-east-1a")]


def test_a_quota_whose_value_cannot_be_read_is_named_with_its_value_unknown(world: World) -> None:
    world.rewire(quotas=FakeServiceQuotas(unreadable=True))
    refuse_everywhere(world, "MaxSpotInstanceCountExceeded", market="spot")

    job = world.submit(spec(capacity="spot", instance_types=["g5.xlarge"])).job

    assert job.state is JobState.QUEUED
    assert job.history[-1].reason == "quota-exceeded"
    assert "All G and VT Spot Instance Requests (L-3819A6DF) = value unknown" in job.status_detail
    assert f"{RAISE} L-3819A6DF" in job.status_detail


def test_a_spot_quota_refusal_still_launches_on_demand_when_the_spec_allows_it(world: World) -> None:
    refuse_everywhere(world, "MaxSpotInstanceCountExceeded", market="spot", types=("g5.xlarge", "g6.xlarge"))

    job = world.submit(spec()).job  # spot-first

    assert job.state is JobState.RUNNING
    attempt = job.current_attempt
    assert attempt is not None
    assert (attempt.instance_type, attempt.market) == ("g5.xlarge", Market.ON_DEMAND)
    assert [(t.instance_type, t.error_code) for t in attempt.tries] == [
        ("g5.xlarge", "MaxSpotInstanceCountExceeded"),
        ("g6.xlarge", "MaxSpotInstanceCountExceeded"),
    ]


def test_a_quota_and_a_capacity_refusal_together_name_both(world: World) -> None:
    world.rewire(quotas=FakeServiceQuotas({"L-3819A6DF": 8.0}))
    refuse_everywhere(world, "MaxSpotInstanceCountExceeded", market="spot")
    refuse_everywhere(world, "InsufficientInstanceCapacity", market="on-demand")

    job = world.submit(spec(instance_types=["g5.xlarge"])).job

    assert job.history[-1].reason == "quota-exceeded"
    assert "(L-3819A6DF) = 8 vCPUs" in job.status_detail
    assert "no capacity (g5.xlarge/us-east-1a/on-demand: InsufficientInstanceCapacity" in job.status_detail


def test_a_job_a_quota_refuses_is_retried_with_the_growing_backoff_and_launches_once_it_is_raised(
    world: World,
) -> None:
    refuse_everywhere(world, "VcpuLimitExceeded", market="on-demand")
    job_id = world.submit(spec(capacity="on-demand", instance_types=["g5.xlarge"])).job.job_id
    waits = []
    for _ in range(3):
        job = world.store.get(job_id)
        assert job.next_try_at is not None
        waits.append(job.next_try_at - world.clock.now())
        world.clock.current = job.next_try_at
        world.reconciler.run()
        assert world.store.get(job_id).history[-1].reason == "quota-exceeded"

    assert waits[0] < waits[1] < waits[2]  # the capacity backoff, counting quota waits too

    world.compute.refuse.clear()  # the quota was raised
    world.clock.current = world.store.get(job_id).next_try_at  # type: ignore[assignment]
    world.reconciler.run()
    assert world.store.get(job_id).state is JobState.RUNNING


def test_quota_refusals_are_counted_by_quota_not_as_capacity_refusals(world: World) -> None:
    recorded = Recorded()
    world.rewire(metrics=recorded)
    refuse_everywhere(world, "MaxSpotInstanceCountExceeded", market="spot")
    refuse_everywhere(world, "InsufficientInstanceCapacity", market="on-demand")

    world.submit(spec(instance_types=["g5.xlarge"]))

    quota = [m.dimensions for m in recorded.metrics if m.name == QUOTA_REFUSALS]
    capacity = [m.dimensions for m in recorded.metrics if m.name == CAPACITY_REFUSALS]
    assert quota == [(("Quota", "L-3819A6DF"),)]
    assert capacity == [(("InstanceType", "g5.xlarge"), ("Market", "on-demand"))] * 2
