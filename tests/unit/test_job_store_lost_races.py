"""A DynamoDB transaction cancelled by a concurrent one is a lost race, like a failed condition."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Job
from gpujobs.domain.spec import validate_spec
from gpujobs.service.ports import ConcurrentUpdateError

SPEC = {"name": "digits", "image": "img:1", "command": ["python", "train.py"], "instance_types": ["g5.xlarge"]}


def a_job() -> Job:
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    job = Job.submitted(job_id="j-0000000000000001", spec=validate_spec(SPEC), now=now, message_id="m-1")
    return job.model_copy(update={"version": 3})


@pytest.mark.parametrize(
    ("codes", "lost_race"),
    [
        (["TransactionConflict"], True),
        (["None", "TransactionConflict"], True),
        (["ConditionalCheckFailed"], True),
        (["ValidationError"], False),
    ],
)
def test_a_cancelled_transaction_is_a_lost_race_only_for_conflicts(codes: list[str], lost_race: bool) -> None:
    client = boto3.client("dynamodb", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    store = DynamoJobStore(table_name="jobs", client=client)
    with Stubber(client) as stub:
        stub.add_client_error(
            "transact_write_items",
            service_error_code="TransactionCanceledException",
            modeled_fields={"CancellationReasons": [{"Code": c} for c in codes]},
        )
        expected = ConcurrentUpdateError if lost_race else client.exceptions.TransactionCanceledException
        with pytest.raises(expected):
            store.save(a_job())
