"""The submit function on moto: SQS messages in, recorded jobs and tagged GPU instances out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpujobs.instance.userdata import parse_user_data
from gpujobs_local.stack import STACK, LambdaContext, MotoStack
from tests.conftest import load_function

pytestmark = pytest.mark.integration

SPEC: dict[str, Any] = {
    "name": "digits",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:1",
    "command": ["python", "/opt/gpujobs/examples/digits/train.py", "--steps", "600"],
    "env": {"NOTE": "$(touch /tmp/pwned); `id` 'q' \"dq\""},
    "instance_types": ["g5.xlarge", "g6.xlarge"],
    "team": "vision",
}


@pytest.fixture
def submit() -> Any:
    return load_function("submit").handler


def job(stack: MotoStack, job_id: str) -> dict[str, Any]:
    from gpujobs.adapters.dynamodb import DynamoJobStore

    return DynamoJobStore(table_name=stack.table, client=stack.ddb).get(job_id).model_dump(mode="json")


def only_job_id(stack: MotoStack) -> str:
    items = stack.ddb.query(
        TableName=stack.table,
        IndexName="ByState",
        KeyConditionExpression="#s = :s",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":s": {"S": "RUNNING"}},
    )["Items"]
    assert len(items) == 1
    return str(items[0]["job_id"]["S"])


def test_a_submitted_spec_launches_tagged_spot_instances_from_the_launch_template(
    stack: MotoStack, submit: Any
) -> None:
    stack.send({**SPEC, "nodes": 2})

    (response,) = stack.deliver(submit)

    assert response == {"batchItemFailures": []}
    job_id = only_job_id(stack)
    instances = stack.instances(**{"gpujobs:job-id": job_id})
    assert len(instances) == 2
    for inst in instances:
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags["gpujobs:stack"] == STACK
        assert tags["gpujobs:attempt"] == "1"
        assert tags["gpujobs:team"] == "vision"
        assert tags["aws:ec2launchtemplate:id"] == stack.launch_template
        assert inst["InstanceType"] == "g5.xlarge"
        assert inst["InstanceLifecycle"] == "spot"
        assert inst["SubnetId"] == stack.subnets[0]
        assert inst.get("PublicIpAddress") is None
    # moto does not copy the template's MetadataOptions onto instances; check the template they came from.
    (version,) = stack.ec2.describe_launch_template_versions(LaunchTemplateId=stack.launch_template)[
        "LaunchTemplateVersions"
    ]
    assert version["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] == "required"
    document = parse_user_data(stack.user_data(instances[0]["InstanceId"]))
    assert document.model_dump()["command"] == SPEC["command"]
    assert document.model_dump()["env"] == SPEC["env"]
    assert document.model_dump()["checkpoint_uri"] == f"s3://{stack.bucket}/jobs/{job_id}/ckpt"
    recorded = job(stack, job_id)
    assert recorded["state"] == "RUNNING"
    assert sorted(recorded["attempts"][0]["instance_ids"]) == sorted(i["InstanceId"] for i in instances)
    observed = [(e["detail"]["from"], e["detail"]["to"]) for e in stack.observed_events()]
    assert observed == [(None, "QUEUED"), ("QUEUED", "LAUNCHING"), ("LAUNCHING", "RUNNING")]


def test_the_job_is_found_by_its_instance_id_through_the_index(stack: MotoStack, submit: Any) -> None:
    from gpujobs.adapters.dynamodb import DynamoJobStore

    stack.send(SPEC)
    stack.deliver(submit)

    (instance,) = stack.instances()
    found = DynamoJobStore(table_name=stack.table, client=stack.ddb).find_by_instance(instance["InstanceId"])
    assert found is not None
    assert found.job_id == only_job_id(stack)


def test_capacity_errors_injected_into_run_instances_fall_through_the_ladder(stack: MotoStack, submit: Any) -> None:
    refused: list[tuple[str, str]] = []

    def no_g5_spot(params: dict[str, Any], **_: Any) -> None:
        if params["InstanceType"] == "g5.xlarge" and "InstanceMarketOptions" in params:
            refused.append((params["InstanceType"], params["NetworkInterfaces"][0]["SubnetId"]))
            raise ClientError(
                {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no g5 spot"}}, "RunInstances"
            )

    stack.on_aws("provide-client-params.ec2.RunInstances", no_g5_spot)
    stack.send(SPEC)

    stack.deliver(submit)

    (instance,) = stack.instances()
    assert instance["InstanceType"] == "g6.xlarge"
    assert instance["InstanceLifecycle"] == "spot"
    assert refused == [("g5.xlarge", stack.subnets[0]), ("g5.xlarge", stack.subnets[1])]
    tries = job(stack, only_job_id(stack))["attempts"][0]["tries"]
    assert [(t["instance_type"], t["zone"], t["error_code"]) for t in tries] == [
        ("g5.xlarge", "us-east-1a", "InsufficientInstanceCapacity"),
        ("g5.xlarge", "us-east-1b", "InsufficientInstanceCapacity"),
    ]


def test_a_message_delivered_twice_launches_nothing_extra(stack: MotoStack, submit: Any) -> None:
    stack.send({**SPEC, "nodes": 2})
    messages = stack.sqs.receive_message(QueueUrl=stack.queue_url, MaxNumberOfMessages=1, VisibilityTimeout=0)[
        "Messages"
    ]

    submit(stack.sqs_event(messages), LambdaContext())
    submit(stack.sqs_event(messages), LambdaContext())

    assert len(stack.instances()) == 2


def test_one_bad_spec_in_a_batch_is_rejected_and_consumed_while_the_good_one_launches(
    stack: MotoStack, submit: Any
) -> None:
    bad_id = stack.send({**SPEC, "nodes": 0, "instance_types": ["x1.32xlarge"]})
    stack.send("name: [unclosed")
    stack.send(SPEC)

    (response,) = stack.deliver(submit)

    assert response == {"batchItemFailures": []}
    assert len(stack.instances()) == 1
    from gpujobs.domain.job_ids import job_id_for

    rejected = job(stack, job_id_for(client_token=None, team=None, message_id=bad_id))
    assert rejected["state"] == "REJECTED"
    assert any(p.startswith("nodes:") for p in rejected["problems"])
    assert any(p.startswith("instance_types:") and "allow-list" in p for p in rejected["problems"])
    assert stack.deliver(submit) == []  # nothing left to retry
    rejected_events = [e for e in stack.observed_events() if e["detail"]["to"] == "REJECTED"]
    assert len(rejected_events) == 2


def test_a_transient_aws_failure_fails_only_that_record_and_ends_in_the_dead_letter_queue(
    stack: MotoStack, submit: Any
) -> None:
    def throttled(**_: Any) -> None:
        raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "RunInstances")

    stack.on_aws("provide-client-params.ec2.RunInstances", throttled)
    message_id = stack.send(SPEC)

    responses = stack.deliver(submit, rounds=10)

    assert next(r["batchItemFailures"] for r in responses) == [{"itemIdentifier": message_id}]
    max_receives = json.loads(
        stack.sqs.get_queue_attributes(QueueUrl=stack.queue_url, AttributeNames=["RedrivePolicy"])["Attributes"][
            "RedrivePolicy"
        ]
    )["maxReceiveCount"]
    assert len(responses) == max_receives
    (dead,) = stack.dead_letters()
    assert dead["MessageId"] == message_id
    assert stack.instances() == []


def test_cancel_through_the_queue_terminates_the_instances(stack: MotoStack, submit: Any) -> None:
    stack.send(SPEC)
    stack.deliver(submit)
    job_id = only_job_id(stack)

    stack.send({"cancel_job_id": job_id})
    stack.deliver(submit)

    assert job(stack, job_id)["state"] == "CANCELLED"
    assert stack.instances() == []


def test_a_cancel_for_an_unknown_job_is_consumed_not_retried(stack: MotoStack, submit: Any) -> None:
    stack.send({"cancel_job_id": "j-0000000000000000"})

    (response,) = stack.deliver(submit)

    assert response == {"batchItemFailures": []}
    assert stack.deliver(submit) == []


def test_a_cost_cap_over_an_allowed_type_without_a_known_price_is_rejected(
    stack: MotoStack, submit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpujobs.domain.job_ids import job_id_for
    from gpujobs.runtime import bootstrap

    monkeypatch.setenv("ALLOWED_INSTANCE_TYPES", "g5.xlarge,g6e.12xlarge")  # the table has no g6e.12xlarge
    bootstrap.reset()
    capped_id = stack.send({**SPEC, "instance_types": ["g6e.12xlarge"], "max_cost_usd": 100})

    (response,) = stack.deliver(submit)

    assert response == {"batchItemFailures": []}
    rejected = job(stack, job_id_for(client_token=None, team=None, message_id=capped_id))
    assert rejected["state"] == "REJECTED"
    assert any(p.startswith("max_cost_usd:") and "g6e.12xlarge" in p for p in rejected["problems"])


def test_a_record_refused_for_its_size_fails_the_record_and_counts_the_alarmed_metric(
    stack: MotoStack, submit: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpujobs.adapters import dynamodb
    from gpujobs.runtime.observability import RECORD_TOO_LARGE_METRIC

    monkeypatch.setattr(dynamodb, "MAX_ITEM_BYTES", 1024)  # every job record is now "too large"
    message_id = stack.send(SPEC)

    (response,) = stack.deliver(submit)

    assert response["batchItemFailures"] == [{"itemIdentifier": message_id}]  # retried, then dead-lettered
    metrics = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert any(m.get(RECORD_TOO_LARGE_METRIC) == [1.0] and m.get("service") == "gpujobs" for m in metrics)
    assert stack.instances() == []
