"""`gpujobs interrupt JOB [--node K]` against moto: a user plays a spot interruption of their own job.

The job is read from the stack's table (moto DynamoDB); the drill goes to AWS FIS. FIS's request is
checked against a recording stand-in of the FIS client (moto stores FIS experiments but plays none of
them), and once against moto's FIS itself, where the local cloud's FIS agent finds what it plays.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Attempt, Job, Market
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli.main import main
from gpujobs_cli.resources import Resources
from gpujobs_local.template import table_definition

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TABLE, JOB = "gpujobs-jobs", "j-00000000000000aa"
ROLE = "arn:aws:iam::123456789012:role/gpujobs-SpotDrillRole"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


@dataclass
class RecordingFis:
    """FIS as the CLI calls it: each request kept, answered as FIS answers."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def create_experiment_template(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("CreateExperimentTemplate", request))
        return {"experimentTemplate": {"id": "EXT1a2b3c4d5e6f7"}}

    def start_experiment(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("StartExperiment", request))
        return {"experiment": {"id": "EXP1a2b3c4d5e6f7", "state": {"status": "initiating"}}}


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[DynamoJobStore]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "GPUJOBS_TABLE": TABLE,
        "GPUJOBS_SPOT_DRILL_ROLE_ARN": ROLE,
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "GPUJOBS_STACK", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        ddb = boto3.client("dynamodb")
        ddb.create_table(**table_definition(table_name=TABLE))
        yield DynamoJobStore(table_name=TABLE, client=ddb)


@pytest.fixture
def fis(monkeypatch: pytest.MonkeyPatch) -> RecordingFis:
    recording = RecordingFis()
    real = Resources.client

    def client(self: Resources, service: str) -> Any:
        return recording if service == "fis" else real(self, service)

    monkeypatch.setattr(Resources, "client", client)
    return recording


def a_running_job(store: DynamoJobStore, *, market: Market = Market.SPOT, nodes: int = 2) -> Job:
    spec = load_spec((EXAMPLES / "digits.yaml").read_bytes()).model_copy(update={"nodes": nodes})
    job = store.create(Job.submitted(job_id=JOB, spec=spec, now=NOW, message_id=None))
    start = NOW + timedelta(minutes=1)
    attempt = Attempt(number=1, started_at=start)
    launching = job.with_attempt(attempt, now=start).transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=start)
    launched = attempt.model_copy(
        update={
            "instance_ids": tuple(f"i-0000000000000000{n}" for n in range(nodes)),
            "instance_type": "g5.xlarge",
            "zone": "us-east-1a",
            "market": market,
        }
    )
    running = launching.with_attempt(launched, now=start).transition(
        JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=start
    )
    return store.save(running)


def test_interrupt_asks_fis_for_a_spot_interruption_of_exactly_that_node_after_two_minutes(
    store: DynamoJobStore, fis: RecordingFis, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a two-node spot gang
    a_running_job(store)

    # When the user interrupts node 1
    code = main(["interrupt", JOB, "--node", "1", "--json"])

    # Then FIS gets one template targeting node 1's instance by ARN, in the stack's account, and starts it
    assert code == 0, capsys.readouterr().err
    (create, template), (start, experiment) = fis.calls
    assert (create, start) == ("CreateExperimentTemplate", "StartExperiment")
    arn = "arn:aws:ec2:us-east-1:123456789012:instance/i-00000000000000001"
    assert template["targets"] == {
        "SpotInstances": {"resourceType": "aws:ec2:spot-instance", "resourceArns": [arn], "selectionMode": "ALL"}
    }
    (action,) = template["actions"].values()
    assert action["actionId"] == "aws:ec2:send-spot-instance-interruptions"
    assert action["parameters"] == {"durationBeforeInterruption": "PT2M"}
    assert action["targets"] == {"SpotInstances": "SpotInstances"}
    assert template["roleArn"] == ROLE
    assert template["stopConditions"] == [{"source": "none"}]
    assert template["tags"] == {"gpujobs:stack": "gpujobs", "gpujobs:job-id": JOB}
    assert experiment["experimentTemplateId"] == "EXT1a2b3c4d5e6f7"
    assert experiment["clientToken"] == template["clientToken"]
    printed = json.loads(capsys.readouterr().out)
    assert printed == {
        "job_id": JOB,
        "node": 1,
        "instance_id": "i-00000000000000001",
        "experiment_id": "EXP1a2b3c4d5e6f7",
        "experiment_template_id": "EXT1a2b3c4d5e6f7",
        "reclaim_after_seconds": 120,
    }


def test_interrupt_says_in_words_which_instance_is_warned_and_how_to_watch(
    store: DynamoJobStore, fis: RecordingFis, capsys: pytest.CaptureFixture[str]
) -> None:
    a_running_job(store, nodes=1)

    assert main(["interrupt", JOB]) == 0

    out = capsys.readouterr().out
    assert f"interrupting node 0 of {JOB} (i-00000000000000000)" in out
    assert "reclaims it in 120 s" in out
    assert f"gpujobs status {JOB} --watch" in out


def test_an_on_demand_instance_is_refused_before_fis_is_asked(
    store: DynamoJobStore, fis: RecordingFis, capsys: pytest.CaptureFixture[str]
) -> None:
    a_running_job(store, market=Market.ON_DEMAND)

    assert main(["interrupt", JOB]) == 2

    assert "only spot instances can be interrupted: i-00000000000000000" in capsys.readouterr().err
    assert fis.calls == []


def test_a_node_the_gang_does_not_have_is_a_usage_error_naming_the_nodes(
    store: DynamoJobStore, fis: RecordingFis, capsys: pytest.CaptureFixture[str]
) -> None:
    a_running_job(store, nodes=2)

    assert main(["interrupt", JOB, "--node", "2"]) == 2

    assert f"{JOB} runs on 2 node(s): --node takes 0 to 1, not 2" in capsys.readouterr().err
    assert fis.calls == []


def test_an_ended_job_or_an_unknown_one_has_nothing_to_interrupt(
    store: DynamoJobStore, fis: RecordingFis, capsys: pytest.CaptureFixture[str]
) -> None:
    job = a_running_job(store)
    ended = job.transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=NOW + timedelta(hours=1))
    store.save(ended)

    assert main(["interrupt", JOB]) == 3
    assert f"{JOB} is CANCELLED: no container of it runs now" in capsys.readouterr().err
    assert main(["interrupt", "j-00000000000000bb"]) == 3
    assert "no job j-00000000000000bb" in capsys.readouterr().err
    assert fis.calls == []


def test_the_experiment_lands_in_fis_where_the_local_clouds_agent_finds_its_target(
    store: DynamoJobStore, capsys: pytest.CaptureFixture[str]
) -> None:
    # moto's FIS, as the local cloud serves it: the experiment and its target are readable back
    a_running_job(store, nodes=1)

    assert main(["interrupt", JOB, "--json"]) == 0

    drill = json.loads(capsys.readouterr().out)
    experiment = boto3.client("fis").get_experiment(id=drill["experiment_id"])["experiment"]
    assert experiment["targets"]["SpotInstances"]["resourceArns"] == [
        "arn:aws:ec2:us-east-1:123456789012:instance/i-00000000000000000"
    ]
    assert experiment["roleArn"] == ROLE
    assert experiment["tags"] == {"gpujobs:stack": "gpujobs", "gpujobs:job-id": JOB}
