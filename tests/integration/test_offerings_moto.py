"""Where EC2 offers each instance type, asked of EC2 (moto) by the launcher's offerings adapter.

Stories: the adapter answers with the zones EC2 lists for each type asked about, so p5e.48xlarge
counts as offered in no zone of us-east-1 and g5.xlarge in the zones moto's copy of EC2's data
lists; it asks once for a set of types and again only six hours later; when EC2 cannot be asked it
answers from its last answer for a type, else from the bundled snapshot for the region, and a type
neither knows stays undescribed, so it is still tried; a failed call is not remembered, so the next
call asks again. moto answers DescribeInstanceTypeOfferings from the same data the snapshot was
generated from, so here the two agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from gpujobs.adapters.catalog import packaged_offerings
from gpujobs.adapters.offerings import Ec2InstanceTypeOfferings
from gpujobs.domain.offerings import offered
from gpujobs_fakes.memory import FixedClock
from gpujobs_fakes.offerings import FakeOfferings
from gpujobs_local.template import properties, resources_of_type

pytestmark = pytest.mark.integration

REGION = "us-east-1"


@pytest.fixture
def ec2(aws_credentials: None) -> Iterator[tuple[Any, list[str]]]:
    with mock_aws():
        client = boto3.client("ec2", region_name=REGION)
        calls: list[str] = []
        client.meta.events.register(
            "before-call.ec2.DescribeInstanceTypeOfferings", lambda params, **_: calls.append(str(params))
        )
        yield client, calls


def test_ec2_says_which_zones_offer_each_type(ec2: tuple[Any, list[str]]) -> None:
    client, calls = ec2
    offerings = Ec2InstanceTypeOfferings(client=client, region=REGION)

    zones = offerings.zones_offering(["p5e.48xlarge", "g5.xlarge"])

    assert zones["p5e.48xlarge"] == frozenset()
    assert zones["g5.xlarge"] == packaged_offerings()["g5.xlarge"][REGION]
    assert not offered(zones, "p5e.48xlarge", "us-east-1a")
    assert offered(zones, "g5.xlarge", "us-east-1a")
    assert len(calls) == 1
    assert "'LocationType': 'availability-zone'" in calls[0]


def test_the_answer_is_kept_for_six_hours(ec2: tuple[Any, list[str]]) -> None:
    client, calls = ec2
    clock = FixedClock()
    offerings = Ec2InstanceTypeOfferings(client=client, region=REGION, clock=clock)

    first = offerings.zones_offering(["g5.xlarge", "g6.xlarge"])
    clock.advance(hours=5, minutes=59)
    again = offerings.zones_offering(["g6.xlarge", "g5.xlarge"])
    clock.advance(minutes=1)
    later = offerings.zones_offering(["g5.xlarge"])

    assert first == again
    assert later == {"g5.xlarge": first["g5.xlarge"]}
    assert len(calls) == 2  # the first call, then once six hours had passed


class Unreachable:
    """EC2 refusing the call, as it does without the IAM grant or when throttled; or, given a client,
    that client until `down` is set."""

    def __init__(self, client: Any = None) -> None:
        self.client, self.down, self.tries = client, client is None, 0

    def get_paginator(self, name: str) -> Any:
        self.tries += 1
        if self.down:
            raise ClientError(
                {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, "DescribeInstanceTypeOfferings"
            )
        return self.client.get_paginator(name)


def test_without_ec2_the_bundled_snapshot_answers_and_an_unknown_type_is_still_tried() -> None:
    ec2: Any = Unreachable()
    offerings = Ec2InstanceTypeOfferings(client=ec2, region=REGION)

    zones = offerings.zones_offering(["p5e.48xlarge", "g5.xlarge", "p7.48xlarge"])
    offerings.zones_offering(["g5.xlarge"])

    assert zones == {"p5e.48xlarge": frozenset(), "g5.xlarge": packaged_offerings()["g5.xlarge"][REGION]}
    assert offered(zones, "p7.48xlarge", "us-east-1a")
    assert ec2.tries == 2  # a failed call is not remembered


def test_without_ec2_the_last_answer_stands_in_however_old(ec2: tuple[Any, list[str]]) -> None:
    flaky: Any = Unreachable(ec2[0])
    clock = FixedClock()
    snapshot = {"g5.xlarge": {REGION: frozenset({"us-east-1z"})}}
    offerings = Ec2InstanceTypeOfferings(client=flaky, region=REGION, clock=clock, bundled=lambda: snapshot)
    answered = offerings.zones_offering(["g5.xlarge"])
    flaky.down = True
    clock.advance(days=2)

    assert offerings.zones_offering(["g5.xlarge"]) == answered
    assert answered["g5.xlarge"] != frozenset({"us-east-1z"})  # EC2's answer, not the snapshot's
    assert flaky.tries == 2


def test_a_region_the_snapshot_does_not_cover_leaves_every_type_to_ec2() -> None:
    ec2: Any = Unreachable()
    offerings = Ec2InstanceTypeOfferings(client=ec2, region="xx-nowhere-1")

    assert offerings.zones_offering(["p5e.48xlarge"]) == {}


def test_the_fake_answers_as_the_adapter_does() -> None:
    fake = FakeOfferings()
    fake.offer("p5e.48xlarge", "us-east-2a")
    fake.offer("g6.xlarge")

    zones = fake.zones_offering(["p5e.48xlarge", "g6.xlarge", "p7.48xlarge"])

    assert zones == {"p5e.48xlarge": frozenset({"us-east-2a"}), "g6.xlarge": frozenset()}
    assert offered(zones, "p7.48xlarge", "us-east-2b")
    assert fake.asked == [frozenset({"p5e.48xlarge", "g6.xlarge", "p7.48xlarge"})]


def test_every_function_that_launches_may_ask_where_types_are_offered() -> None:
    statements = properties("LaunchPolicy")["PolicyDocument"]["Statement"]
    launchers = {
        logical_id
        for logical_id, function in resources_of_type("AWS::Serverless::Function").items()
        if {"Ref": "LaunchPolicy"} in function["Properties"].get("Policies", [])
    }

    (describe,) = [s for s in statements if "ec2:DescribeInstanceTypeOfferings" in s.get("Action", [])]
    assert describe["Effect"] == "Allow"
    assert describe["Resource"] == "*"  # EC2 Describe calls take no resource-level permissions
    assert {"SubmitFunction", "ReconcilerFunction"} <= launchers
