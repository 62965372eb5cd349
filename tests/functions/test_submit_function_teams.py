"""The submit function on moto with a team configuration: the SQS SenderId decides who may act.

moto gives every message the same SenderId (`MOTO_SENDER`, its default user's unique id): the first
test proves it arrives through the event source as Lambda's would. `deliver(sender=...)` plays a
message another principal sent. The configuration is an SSM parameter, as the stack's
`TeamsParameterName` names it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Job
from gpujobs.domain.job_ids import job_id_for
from gpujobs.domain.states import JobState
from gpujobs.service.ports import JobNotFoundError
from gpujobs_local.stack import MOTO_SENDER, MotoStack
from tests.conftest import load_function

pytestmark = pytest.mark.integration

OTHER_TEAMS_ROLE = "AROAOTHERTEAMEXAMPLE1"
TEAMS = json.dumps(
    {
        "teams": {
            "vision": {"principals": [MOTO_SENDER], "max_nodes": 2},
            "speech": {"principals": [OTHER_TEAMS_ROLE]},
        }
    }
)
SPEC: dict[str, Any] = {
    "name": "digits",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge"],
    "team": "vision",
    "client_token": "nightly-1",
}
VISION_JOB = job_id_for(client_token="nightly-1", team="vision", message_id=None)


@pytest.fixture
def stack(aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoStack]:
    from gpujobs.runtime import bootstrap

    with mock_aws():
        built = MotoStack(teams=TEAMS)
        for name, value in built.env.items():
            monkeypatch.setenv(name, value)
        bootstrap.reset()
        yield built
        bootstrap.reset()


@pytest.fixture
def submit(stack: MotoStack) -> Any:
    return load_function("submit").handler


def job(stack: MotoStack, job_id: str) -> Job:
    return DynamoJobStore(table_name=stack.table, client=stack.ddb).get(job_id)


def test_moto_delivers_a_sender_id_and_the_teams_principal_launches(stack: MotoStack, submit: Any) -> None:
    stack.send(SPEC)
    (message,) = stack.sqs.receive_message(QueueUrl=stack.queue_url, AttributeNames=["All"], VisibilityTimeout=0)[
        "Messages"
    ]
    assert message["Attributes"]["SenderId"] == MOTO_SENDER

    (response,) = stack.deliver(submit)

    assert response == {"batchItemFailures": []}
    assert job(stack, VISION_JOB).state is JobState.RUNNING


def test_another_teams_principal_is_rejected_and_cannot_squat_the_job_id(stack: MotoStack, submit: Any) -> None:
    message_id = stack.send(SPEC)

    (response,) = stack.deliver(submit, sender=f"{OTHER_TEAMS_ROLE}:mallory")

    assert response == {"batchItemFailures": []}
    rejected = job(stack, job_id_for(client_token=None, team=None, message_id=message_id))
    assert rejected.state is JobState.REJECTED
    assert any("'vision'" in p and OTHER_TEAMS_ROLE in p for p in rejected.problems)
    assert stack.instances() == []
    stack.send(SPEC)
    stack.deliver(submit)
    assert job(stack, VISION_JOB).state is JobState.RUNNING


def test_a_cancel_from_another_team_is_consumed_counted_and_ignored(
    stack: MotoStack, submit: Any, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    stack.send(SPEC)
    stack.deliver(submit)
    stack.send({"cancel_job_id": VISION_JOB})

    (response,) = stack.deliver(submit, sender=f"{OTHER_TEAMS_ROLE}:mallory")

    assert response == {"batchItemFailures": []}
    assert stack.deliver(submit) == []  # consumed, not retried
    assert job(stack, VISION_JOB).state is JobState.RUNNING
    assert len(stack.instances()) == 1
    assert "cancel refused" in caplog.messages
    assert '"CancelsRefused"' in capsys.readouterr().out


def test_nodes_beyond_the_teams_limit_are_rejected_naming_the_field(stack: MotoStack, submit: Any) -> None:
    message_id = stack.send({**SPEC, "nodes": 4})

    stack.deliver(submit)

    rejected = job(stack, job_id_for(client_token=None, team=None, message_id=message_id))
    assert any(p.startswith("nodes: ") for p in rejected.problems)
    assert stack.instances() == []


def test_the_local_clouds_sqs_source_hands_the_function_the_sender_id(stack: MotoStack) -> None:
    from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

    from gpujobs_local.event_sources import _sqs_record

    stack.send(SPEC)
    (message,) = stack.sqs.receive_message(QueueUrl=stack.queue_url, AttributeNames=["All"])["Messages"]

    record = SQSRecord(_sqs_record(message, "arn:aws:sqs:us-east-1:123456789012:jobs", "us-east-1"))

    assert record.attributes.sender_id == MOTO_SENDER


def test_the_same_spec_sent_again_with_its_token_is_the_same_job_after_a_round_trip_through_the_table(
    stack: MotoStack, submit: Any
) -> None:
    stack.send(SPEC)
    stack.deliver(submit)
    again = stack.send({**SPEC, "nodes": 1, "idle": {"gpu_util_below_percent": 5.0}})  # the defaults, spelled out

    (response,) = stack.deliver(submit)

    assert response == {"batchItemFailures": []}
    assert job(stack, VISION_JOB).state is JobState.RUNNING
    assert len(stack.instances()) == 1
    with pytest.raises(JobNotFoundError):
        job(stack, job_id_for(client_token=None, team=None, message_id=again))
