"""The adapters of a quota refusal: EC2's vCPU-quota codes become QuotaExceededError (not a capacity
error), and Service Quotas' value is read, or said unknown when the call fails.

moto models neither: its RunInstances never answers `VcpuLimitExceeded`, and its Service Quotas
answers `NoSuchResourceException` for ec2 in every Region. So the refusal is botocore's Stubber on a
real EC2 client, and the unreadable quota is moto's own answer (the path a refused call takes too).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from gpujobs.adapters.ec2 import Ec2Compute
from gpujobs.adapters.quotas import Ec2ServiceQuotas
from gpujobs.domain.job import Market
from gpujobs.service.ports import CapacityError, LaunchRequest, QuotaExceededError, Subnet

pytestmark = pytest.mark.integration

REGION = "us-east-1"


@pytest.fixture
def aws(aws_credentials: None) -> Iterator[None]:
    with mock_aws():
        yield


def request(market: Market) -> LaunchRequest:
    return LaunchRequest(
        job_id="j-0123456789abcdef",
        attempt=1,
        team="vision",
        name="digits",
        count=1,
        instance_type="g5.xlarge",
        subnet=Subnet("subnet-a", "us-east-1a"),
        market=market,
        client_token="tok",
        user_data="{}",
    )


def refused_with(code: str) -> tuple[Ec2Compute, Stubber]:
    ec2: Any = boto3.client("ec2", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(ec2)
    stubber.add_client_error("run_instances", service_error_code=code, service_message=f"{code} here", http_status_code=400)  # fmt: skip
    compute = Ec2Compute(
        client=ec2, launch_template_id="lt-1", security_group_id="sg-1", subnet_ids=["subnet-a"], stack_name="s"
    )
    return compute, stubber


@pytest.mark.parametrize(
    ("code", "market"), [("VcpuLimitExceeded", Market.ON_DEMAND), ("MaxSpotInstanceCountExceeded", Market.SPOT)]
)
def test_a_vcpu_quota_refusal_is_a_quota_error_that_still_walks_to_the_next_rung(code: str, market: Market) -> None:
    compute, stubber = refused_with(code)

    with stubber, pytest.raises(QuotaExceededError) as raised:
        compute.run_instances(request(market))

    assert raised.value.code == code
    assert isinstance(raised.value, CapacityError)


def test_a_capacity_refusal_is_not_a_quota_error() -> None:
    compute, stubber = refused_with("InsufficientInstanceCapacity")

    with stubber, pytest.raises(CapacityError) as raised:
        compute.run_instances(request(Market.SPOT))

    assert not isinstance(raised.value, QuotaExceededError)


def test_a_quota_value_service_quotas_will_not_give_is_unknown_not_an_error(aws: None) -> None:
    quotas = Ec2ServiceQuotas(client=boto3.client("service-quotas", region_name=REGION))

    assert quotas.current_value("L-DB2E81BA") is None


def test_a_quota_value_is_read_from_get_service_quota() -> None:
    client: Any = boto3.client("service-quotas", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(client)
    stubber.add_response(
        "get_service_quota",
        {"Quota": {"QuotaCode": "L-3819A6DF", "Value": 64.0}},
        {"ServiceCode": "ec2", "QuotaCode": "L-3819A6DF"},
    )

    with stubber:
        assert Ec2ServiceQuotas(client=client).current_value("L-3819A6DF") == 64.0
