"""The adapters against AWS's own hard limits, where moto does not enforce them (round 2, §6).

Stories: a job record over 400 KB is refused with a typed error before DynamoDB sees it, and
DynamoDB's own refusal (moto draws it at 405,000 bytes) maps to the same error; the size is counted
as DynamoDB counts it. "Checkpoint now" to a 64-node gang goes out in SendCommands of at most 50
instances. A reused ClientToken sent with other parameters is a typed mismatch, not a failed launch.
A stray instance whose attempt tag is not a number is left out of the stack's instance list.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from gpujobs.adapters.dynamodb import MAX_ITEM_BYTES, DynamoJobStore, item_size, job_item
from gpujobs.adapters.ec2 import Ec2Compute
from gpujobs.adapters.ssm import SsmSignaller
from gpujobs.contract import ATTEMPT_TAG as TAG_ATTEMPT
from gpujobs.contract import JOB_TAG as TAG_JOB
from gpujobs.contract import STACK_TAG as TAG_STACK
from gpujobs.domain.job import Job, Market
from gpujobs.domain.spec import validate_spec
from gpujobs.service.ports import (
    JobNotFoundError,
    JobRecordTooLargeError,
    LaunchRequest,
    LaunchTokenMismatchError,
    Subnet,
)
from gpujobs_local.template import table_definition

pytestmark = pytest.mark.integration

REGION = "us-east-1"
STACK = "gpujobs-test"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture
def aws(aws_credentials: None) -> Iterator[None]:
    with mock_aws():
        yield


def client(service: str) -> Any:
    return boto3.client(service, region_name=REGION)


def a_job(job_id: str = "j-0123456789abcdef") -> Job:
    spec = validate_spec(
        {"name": "big", "image": "train:1", "command": ["python", "train.py"], "instance_types": ["g5.xlarge"]}
    )
    return Job.submitted(job_id=job_id, spec=spec, now=NOW, message_id="m-1")


# --- DynamoDB item size ---------------------------------------------------------------------------


def test_item_size_counts_names_and_values_as_dynamodb_does() -> None:
    assert item_size({"pk": {"S": "JOB#é"}}) == 2 + 6  # UTF-8 bytes of the name and the string
    assert item_size({"n": {"N": "123.45"}}) == 1 + 4  # 5 significant digits: 3 bytes, plus 1
    assert item_size({"n": {"N": "1000"}}) == 1 + 2
    assert item_size({"b": {"B": b"\x00" * 10}, "t": {"BOOL": True}}) == 1 + 10 + 1 + 1
    assert item_size({"l": {"L": [{"S": "ab"}, {"NULL": True}]}}) == 1 + 3 + (1 + 2) + (1 + 1)
    assert item_size({"m": {"M": {"k": {"S": "v"}}}}) == 1 + 3 + (1 + 1 + 1)


@pytest.fixture
def table(aws: None) -> Any:
    dynamodb = client("dynamodb")
    dynamodb.create_table(**table_definition(table_name="jobs"))
    return dynamodb


def test_a_record_over_400_kb_is_refused_with_a_typed_error_and_counted_and_nothing_is_written(table: Any) -> None:
    refused: list[JobRecordTooLargeError] = []
    store = DynamoJobStore(table_name="jobs", client=table, on_too_large=refused.append)
    job = store.create(a_job())
    bloated = job.model_copy(update={"submission_excerpt": "x" * MAX_ITEM_BYTES})

    with pytest.raises(JobRecordTooLargeError) as error:
        store.save(bloated)
    with pytest.raises(JobRecordTooLargeError):
        store.create(bloated.model_copy(update={"job_id": "j-fedcba9876543210"}))

    assert error.value.size > MAX_ITEM_BYTES
    assert [e.job_id for e in refused] == [job.job_id, "j-fedcba9876543210"]
    assert store.get(job.job_id) == job
    with pytest.raises(JobNotFoundError):
        store.get("j-fedcba9876543210")


def test_dynamodbs_own_size_refusal_is_the_same_typed_error(table: Any) -> None:
    refused: list[JobRecordTooLargeError] = []
    store = DynamoJobStore(table_name="jobs", client=table, on_too_large=refused.append)
    job = store.create(a_job())
    # Under 400 KB by DynamoDB's count, over moto's own line (405,000 bytes): moto refuses it.
    padding = 406_000 - item_size(job_item(job))
    nearly = job.model_copy(update={"submission_excerpt": "x" * padding})
    assert 405_000 < item_size(job_item(nearly.model_copy(update={"version": 2}))) <= MAX_ITEM_BYTES

    with pytest.raises(JobRecordTooLargeError):
        store.save(nearly)

    assert len(refused) == 1
    assert store.get(job.job_id) == job


# --- SSM SendCommand: at most 50 instance ids -------------------------------------------------------


def test_checkpoint_now_to_a_64_node_gang_is_sent_in_commands_of_at_most_50_instances(aws: None) -> None:
    ssm = client("ssm")
    ssm.create_document(
        Name="gpujobs-checkpoint-now",
        Content=json.dumps({"schemaVersion": "2.2", "mainSteps": []}),
        DocumentType="Command",
    )
    gang = [f"i-{n:017x}" for n in range(64)]

    SsmSignaller(client=ssm, document_name="gpujobs-checkpoint-now").checkpoint_now(
        instance_ids=gang, container="gpujobs-j-0123456789abcdef-a1"
    )

    commands = ssm.list_commands()["Commands"]
    assert all(len(c["InstanceIds"]) <= 50 for c in commands)
    assert sorted(i for c in commands for i in c["InstanceIds"]) == gang


# --- EC2 RunInstances ClientToken --------------------------------------------------------------------


def test_a_client_token_reused_with_other_parameters_is_a_typed_mismatch_not_a_rejected_launch() -> None:
    ec2 = boto3.client("ec2", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    compute = Ec2Compute(
        client=ec2, launch_template_id="lt-1", security_group_id="sg-1", subnet_ids=["subnet-a"], stack_name=STACK
    )
    request = LaunchRequest(
        job_id="j-0123456789abcdef",
        attempt=1,
        team="default",
        name="digits",
        count=1,
        instance_type="g5.xlarge",
        subnet=Subnet("subnet-a", "us-east-1a"),
        market=Market.SPOT,
        client_token="j-0123456789abcdef-a1-0011223344556677",
        user_data="{}",
    )
    with Stubber(ec2) as stub:  # moto ignores client tokens altogether (round 2, §6)
        stub.add_client_error(
            "run_instances",
            service_error_code="IdempotentParameterMismatch",
            service_message="Arguments on this idempotent request are inconsistent with arguments used in previous request(s).",
        )
        with pytest.raises(LaunchTokenMismatchError) as error:
            compute.run_instances(request)

    assert error.value.client_token == request.client_token


# --- the stack's instances ------------------------------------------------------------------------


def test_a_stray_instance_with_a_non_integer_attempt_tag_is_left_out_not_a_crash(aws: None) -> None:
    ec2 = client("ec2")

    def launch(attempt: str) -> str:
        tags = [
            {"Key": TAG_STACK, "Value": STACK},
            {"Key": TAG_JOB, "Value": "j-1"},
            {"Key": TAG_ATTEMPT, "Value": attempt},
        ]
        reservation = ec2.run_instances(
            ImageId="ami-12c6146b",
            InstanceType="g5.xlarge",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )
        instance_id: str = reservation["Instances"][0]["InstanceId"]
        return instance_id

    ours = launch("2")
    launch("two")
    launch("-1")
    compute = Ec2Compute(
        client=ec2, launch_template_id="lt-unused", security_group_id="sg-unused", subnet_ids=[], stack_name=STACK
    )

    assert [(i.instance_id, i.attempt) for i in compute.list_instances()] == [(ours, 2)]


# --- DynamoDB BatchGetItem (the reconciler's reads) -----------------------------------------------


def test_many_jobs_are_read_in_batches_of_at_most_100_keys_consistently(table: Any) -> None:
    store = DynamoJobStore(table_name="jobs", client=table)
    ids = [f"j-{n:016x}" for n in range(250)]
    for job_id in ids:
        store.create(a_job(job_id))
    calls: list[dict[str, Any]] = []
    table.meta.events.register(
        "provide-client-params.dynamodb.BatchGetItem", lambda params, **_: calls.append(params["RequestItems"])
    )

    found = store.get_many([*ids, "j-ffffffffffffffff", ids[0]])  # one unknown, one asked twice

    assert sorted(found) == ids
    assert all(found[i].version == 1 and found[i].job_id == i for i in ids)
    assert [len(c["jobs"]["Keys"]) for c in calls] == [100, 100, 51]
    assert all(c["jobs"]["ConsistentRead"] is True for c in calls)


class LeavesKeysUnprocessed:
    """A DynamoDB client whose BatchGetItem answers only the first key of each call, as a throttled
    table (or the 16 MB response limit) does: the rest come back as UnprocessedKeys."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.batch_calls = 0
        self.get_calls = 0

    def batch_get_item(self, **kwargs: Any) -> dict[str, Any]:
        self.batch_calls += 1
        (table, asked), *_ = kwargs["RequestItems"].items()
        first, rest = asked["Keys"][:1], asked["Keys"][1:]
        answer = self._client.batch_get_item(RequestItems={table: {**asked, "Keys": first}})
        if rest:
            answer["UnprocessedKeys"] = {table: {**asked, "Keys": rest}}
        return answer  # type: ignore[no-any-return]

    def get_item(self, **kwargs: Any) -> dict[str, Any]:
        self.get_calls += 1
        return self._client.get_item(**kwargs)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_keys_left_unprocessed_are_asked_again_and_then_read_one_by_one(table: Any) -> None:
    ids = [f"j-{n:016x}" for n in range(10)]
    writer = DynamoJobStore(table_name="jobs", client=table)
    for job_id in ids:
        writer.create(a_job(job_id))
    throttled = LeavesKeysUnprocessed(table)
    store = DynamoJobStore(table_name="jobs", client=throttled)  # type: ignore[arg-type]

    found = store.get_many(ids)

    assert sorted(found) == ids  # nothing lost to the throttling
    assert throttled.batch_calls == 1 + 4  # one call per 100 keys, then BATCH_GET_ROUNDS more
    assert throttled.get_calls == len(ids) - throttled.batch_calls
