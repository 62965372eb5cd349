"""The reconciler's one read of the Reports function's throttles (`adapters.cloudwatch.LambdaThrottles`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.cloudwatch import LambdaThrottles

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
FUNCTION = "gpujobs-test-ReportsFunction-abc"


@pytest.fixture
def cloudwatch(aws_credentials: None) -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("cloudwatch", region_name="us-east-1")


def throttles(cloudwatch: Any, function: str, at: datetime, count: float) -> None:
    cloudwatch.put_metric_data(
        Namespace="AWS/Lambda",
        MetricData=[
            {
                "MetricName": "Throttles",
                "Dimensions": [{"Name": "FunctionName", "Value": function}],
                "Timestamp": at,
                "Value": count,
            }
        ],
    )


def test_the_newest_throttled_minute_of_the_reports_function_is_read(cloudwatch: Any) -> None:
    throttles(cloudwatch, FUNCTION, NOW - timedelta(minutes=40), 3)
    throttles(cloudwatch, FUNCTION, NOW - timedelta(minutes=12), 7)
    throttles(cloudwatch, FUNCTION, NOW - timedelta(minutes=5), 0)
    throttles(cloudwatch, "another-function", NOW - timedelta(minutes=1), 9)

    at = LambdaThrottles(client=cloudwatch, function_name=FUNCTION)(NOW)

    assert at is not None
    assert NOW - timedelta(minutes=12) < at <= NOW - timedelta(minutes=10)


def test_no_throttle_in_the_last_hour_reads_as_none(cloudwatch: Any) -> None:
    throttles(cloudwatch, FUNCTION, NOW - timedelta(minutes=90), 5)

    assert LambdaThrottles(client=cloudwatch, function_name=FUNCTION)(NOW) is None
