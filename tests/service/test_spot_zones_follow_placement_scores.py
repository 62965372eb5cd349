"""Issue 21, pools chosen by evidence: EC2's spot placement scores order a ladder's spot zones after
the stack's own reclaims (`domain.pools`), asked once per walk for the job's types and node count,
never for a job that cannot go to spot, and a launch goes on without them."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpujobs.adapters.placement_scores import Ec2PlacementScores
from gpujobs.domain.job import Market
from gpujobs.domain.states import JobState
from gpujobs_fakes.evidence import FixedPlacementScores
from tests.service.conftest import World, spec


def test_a_spot_launch_goes_first_to_the_zone_ec2_scores_highest(world: World) -> None:
    scores = FixedPlacementScores({"us-east-1a": 2, "us-east-1b": 8})
    world.rewire(placement_scores=scores)
    world.compute.refuse[("g5.xlarge", "us-east-1b", "spot")] = "InsufficientInstanceCapacity"

    job = world.submit(spec(capacity="spot-first", nodes=2)).job

    tried = [(c.instance_type, c.subnet.zone, c.market) for c in world.compute.calls]
    assert tried[:2] == [("g5.xlarge", "us-east-1b", Market.SPOT), ("g5.xlarge", "us-east-1a", Market.SPOT)]
    running = world.store.get(job.job_id)
    assert running.state is JobState.RUNNING
    assert running.current_attempt is not None
    assert running.current_attempt.zone == "us-east-1a"
    assert scores.asked == [(("g5.xlarge", "g6.xlarge"), 2)]


def test_an_on_demand_job_does_not_ask_for_spot_scores(world: World) -> None:
    scores = FixedPlacementScores({"us-east-1b": 9})
    world.rewire(placement_scores=scores)

    job = world.submit(spec(capacity="on-demand")).job

    assert world.store.get(job.job_id).state is JobState.RUNNING
    assert [c.subnet.zone for c in world.compute.calls][:1] == ["us-east-1a"]
    assert scores.asked == []


class ThrottledEc2:
    """EC2 refusing every GetSpotPlacementScores (an account over its new-configurations cap)."""

    def describe_availability_zones(self) -> dict[str, Any]:
        return {"AvailabilityZones": [{"ZoneName": "us-east-1a", "ZoneId": "use1-az6"}]}

    def get_spot_placement_scores(self, **_: Any) -> dict[str, Any]:
        raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "cap"}}, "GetSpotPlacementScores")


def test_a_launch_goes_on_in_the_subnets_order_when_ec2_gives_no_scores(world: World) -> None:
    world.rewire(placement_scores=Ec2PlacementScores(client=ThrottledEc2(), region="us-east-1", clock=world.clock))  # type: ignore[arg-type]

    job = world.submit(spec(capacity="spot")).job

    assert world.store.get(job.job_id).state is JobState.RUNNING
    assert [(c.subnet.zone, c.market) for c in world.compute.calls] == [("us-east-1a", Market.SPOT)]
