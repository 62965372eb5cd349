"""EC2's spot placement scores as the launcher reads them (`adapters.placement_scores`): one request
per job shape, checked against botocore's own model of GetSpotPlacementScores; zone IDs mapped to
this account's zone names; answers kept an hour; a failure never raises and is not asked again for
15 minutes, the last answer standing meanwhile."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.validate import validate_parameters

from gpujobs.adapters.placement_scores import RETRY_AFTER, SCORES_TTL, Ec2PlacementScores
from gpujobs_fakes.memory import FixedClock

# This account's names for the zones: IDs name the same place in every account, names do not.
ZONES = [
    {"ZoneName": "us-east-1a", "ZoneId": "use1-az6"},
    {"ZoneName": "us-east-1b", "ZoneId": "use1-az1"},
    {"ZoneName": "us-east-1c", "ZoneId": "use1-az2"},
]
_MODEL = boto3.session.Session().client("ec2", region_name="us-east-1").meta.service_model


class FakeEc2:
    """Answers GetSpotPlacementScores from `scores` (zone ID -> score), a page at a time, after
    validating each request against botocore's model; `fail` makes the next calls raise it."""

    def __init__(self, scores: dict[str, int], *, page_size: int = 2) -> None:
        self.scores = scores
        self.page_size = page_size
        self.requests: list[dict[str, Any]] = []
        self.zone_asks = 0
        self.fail: Exception | None = None

    def describe_availability_zones(self) -> dict[str, Any]:
        self.zone_asks += 1
        return {"AvailabilityZones": ZONES}

    def get_spot_placement_scores(self, **request: Any) -> dict[str, Any]:
        validate_parameters(request, _MODEL.operation_model("GetSpotPlacementScores").input_shape)
        self.requests.append(request)
        if self.fail is not None:
            raise self.fail
        entries = [
            {"Region": "us-east-1", "AvailabilityZoneId": zone_id, "Score": score}
            for zone_id, score in sorted(self.scores.items())
        ]
        start = int(request.get("NextToken", "0"))
        page: dict[str, Any] = {"SpotPlacementScores": entries[start : start + self.page_size]}
        if start + self.page_size < len(entries):
            page["NextToken"] = str(start + self.page_size)
        return page


def throttled() -> ClientError:
    return ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "GetSpotPlacementScores")


def test_scores_come_back_by_this_accounts_zone_names_for_the_jobs_types_and_node_count() -> None:
    ec2 = FakeEc2({"use1-az6": 3, "use1-az1": 9, "use1-az2": 6, "use1-az4": 8})
    scores = Ec2PlacementScores(client=ec2, region="us-east-1", clock=FixedClock())  # type: ignore[arg-type]

    answer = scores.zone_scores(["g6.12xlarge", "g5.12xlarge", "g5.12xlarge"], nodes=4)

    # use1-az4 is a zone of the region the stack has no name for (no subnet, not in this account's list)
    assert answer == {"us-east-1a": 3, "us-east-1b": 9, "us-east-1c": 6}
    first = ec2.requests[0]
    assert first["InstanceTypes"] == ["g5.12xlarge", "g6.12xlarge"]
    assert (first["TargetCapacity"], first["TargetCapacityUnitType"]) == (4, "units")
    assert first["SingleAvailabilityZone"] is True
    assert first["RegionNames"] == ["us-east-1"]
    assert len(ec2.requests) == 2  # four entries in pages of two: the second page was asked for


def test_one_ask_per_shape_an_hour_and_the_zone_names_once() -> None:
    ec2 = FakeEc2({"use1-az6": 5})
    clock = FixedClock()
    scores = Ec2PlacementScores(client=ec2, region="us-east-1", clock=clock)  # type: ignore[arg-type]

    scores.zone_scores(["g5.xlarge"], nodes=1)
    clock.advance(seconds=SCORES_TTL.total_seconds() - 1)
    ec2.scores = {"use1-az6": 1}
    assert scores.zone_scores(["g5.xlarge"], nodes=1) == {"us-east-1a": 5}
    assert len(ec2.requests) == 1
    scores.zone_scores(["g5.xlarge"], nodes=2)  # another shape is another configuration
    assert len(ec2.requests) == 2

    clock.advance(seconds=1)
    assert scores.zone_scores(["g5.xlarge"], nodes=1) == {"us-east-1a": 1}
    assert ec2.zone_asks == 1


@pytest.mark.parametrize(
    "failure",
    [throttled(), ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, "GetSpotPlacementScores")],
)
def test_a_failed_ask_never_raises_keeps_the_last_answer_and_waits_before_asking_again(failure: Exception) -> None:
    ec2 = FakeEc2({"use1-az1": 7})
    clock = FixedClock()
    scores = Ec2PlacementScores(client=ec2, region="us-east-1", clock=clock)  # type: ignore[arg-type]
    fresh = Ec2PlacementScores(client=ec2, region="us-east-1", clock=clock)  # type: ignore[arg-type]
    assert scores.zone_scores(["p5.48xlarge"], nodes=2) == {"us-east-1b": 7}

    clock.advance(seconds=SCORES_TTL.total_seconds())
    ec2.fail = failure
    assert scores.zone_scores(["p5.48xlarge"], nodes=2) == {"us-east-1b": 7}
    assert fresh.zone_scores(["p5.48xlarge"], nodes=2) == {}
    asked = len(ec2.requests)

    clock.advance(seconds=RETRY_AFTER.total_seconds() - 1)
    assert scores.zone_scores(["p5.48xlarge"], nodes=2) == {"us-east-1b": 7}
    assert len(ec2.requests) == asked  # a capped or throttled account is not asked every minute

    clock.advance(seconds=1)
    ec2.fail = None
    ec2.scores = {"use1-az2": 4}
    assert scores.zone_scores(["p5.48xlarge"], nodes=2) == {"us-east-1c": 4}
