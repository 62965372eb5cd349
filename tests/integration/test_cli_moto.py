"""The `gpujobs` CLI against moto: what it sends to the queue and what it reads from the table.

The table is built from template.yaml (template.table_definition), so the CLI reads the same
indexes the stack deploys. Jobs are written with DynamoJobStore, as the control plane writes them;
the CLI only ever reads jobs and sends messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Job, Kept
from gpujobs.domain.job_ids import job_id_for
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli import commands
from gpujobs_cli.main import main
from gpujobs_local.template import table_definition

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


@dataclass
class Stack:
    sqs: Any
    store: DynamoJobStore
    queue_url: str
    table_name: str

    def messages(self) -> list[dict[str, Any]]:
        received = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get("Messages", [])
        return [json.loads(m["Body"]) for m in received]

    def add_job(self, job_id: str, *, example: str = "digits.yaml", at: datetime = NOW) -> Job:
        spec = load_spec((EXAMPLES / example).read_bytes())
        return self.store.create(Job.submitted(job_id=job_id, spec=spec, now=at, message_id=None))


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "GPUJOBS_QUEUE_URL", "GPUJOBS_TABLE", "GPUJOBS_STACK"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        yield


@pytest.fixture
def stack_resources(aws: None) -> Stack:
    sqs = boto3.client("sqs")
    ddb = boto3.client("dynamodb")
    queue_url = sqs.create_queue(QueueName="gpujobs-jobs")["QueueUrl"]
    ddb.create_table(**table_definition(table_name="gpujobs-jobs"))
    return Stack(sqs, DynamoJobStore(table_name="gpujobs-jobs", client=ddb), queue_url, "gpujobs-jobs")


@pytest.fixture
def env_stack(stack_resources: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """The queue and table named by the env overrides; no CloudFormation stack exists."""
    monkeypatch.setenv("GPUJOBS_QUEUE_URL", stack_resources.queue_url)
    monkeypatch.setenv("GPUJOBS_TABLE", stack_resources.table_name)
    return stack_resources


@pytest.fixture
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(commands, "sleep", slept.append)
    return slept


# ---- submit ----------------------------------------------------------------------------------
def test_submit_sends_the_spec_with_a_client_token_and_prints_the_job_id(
    env_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["submit", str(EXAMPLES / "cpu-smoke.json"), "--json"])

    printed = json.loads(capsys.readouterr().out)
    (body,) = env_stack.messages()
    assert code == 0
    token = body["client_token"]
    assert len(token) == 32
    spec = load_spec((EXAMPLES / "cpu-smoke.json").read_bytes())
    assert load_spec(json.dumps(body)) == spec.model_copy(update={"client_token": token})
    assert printed["job_id"] == job_id_for(client_token=token, team="default", message_id=None)
    assert printed["client_token"] == token


def test_submit_keeps_a_given_client_token_so_resubmitting_names_the_same_job(
    env_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["submit", str(EXAMPLES / "digits-2node.yaml"), "--client-token", "nightly-1"]

    assert main(argv) == 0
    assert main(argv) == 0

    first, second = capsys.readouterr().out.splitlines()
    assert first == second == job_id_for(client_token="nightly-1", team="ml-platform", message_id=None)
    assert [m["client_token"] for m in env_stack.messages()] == ["nightly-1", "nightly-1"]


def stopped_by_budget(job: Job, *, now: datetime) -> Job:
    """The job as the control plane leaves it after a budget stop: launched, running, stopped."""
    return (
        job.transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=now)
        .transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=now)
        .transition(JobState.STOPPED, Reason.BUDGET_EXCEEDED, now=now)
    )


def test_submit_wait_returns_once_the_job_runs(
    env_stack: Stack, no_waiting: list[float], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a control plane that records the job during the CLI's first pause
    def control_plane_records_the_job(seconds: float) -> None:
        no_waiting.append(seconds)
        (body,) = env_stack.messages()
        job_id = job_id_for(client_token=body["client_token"], team="default", message_id=None)
        job = env_stack.store.create(
            Job.submitted(job_id=job_id, spec=load_spec(json.dumps(body)), now=NOW, message_id=None)
        )
        env_stack.store.save(stopped_by_budget(job, now=NOW))

    monkeypatch.setattr(commands, "sleep", control_plane_records_the_job)

    code = main(["submit", str(EXAMPLES / "digits.yaml"), "--wait"])

    out, err = capsys.readouterr()
    assert code == 0
    assert no_waiting == [commands.POLL_SECONDS]
    assert "waiting for the control plane to record the job" in err
    assert "STOPPED" in err
    assert "state     STOPPED" in out


def test_submit_wait_ends_when_the_control_plane_rejects_the_submission(
    env_stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a control plane whose allow-list refuses the spec: it records REJECTED under the message id
    def control_plane_rejects(seconds: float) -> None:
        (message,) = env_stack.sqs.receive_message(QueueUrl=env_stack.queue_url)["Messages"]
        job_id = job_id_for(client_token=None, team=None, message_id=message["MessageId"])
        env_stack.store.create(
            Job.rejected(job_id=job_id, problems=["instance_types: not allowed"], excerpt="", now=NOW, message_id="m")
        )

    monkeypatch.setattr(commands, "sleep", control_plane_rejects)

    code = main(["submit", str(EXAMPLES / "digits.yaml"), "--wait", "--json"])

    assert code == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["job"]["state"] == "REJECTED"
    assert printed["job"]["problems"] == ["instance_types: not allowed"]


# ---- status and list -------------------------------------------------------------------------
def test_status_shows_a_recorded_job(env_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    env_stack.add_job("j-0000000000000001")

    assert main(["status", "j-0000000000000001"]) == 0
    text = capsys.readouterr().out
    assert "state     QUEUED" in text
    assert "name      digits" in text

    assert main(["status", "j-0000000000000001", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "QUEUED"


def test_status_of_an_unknown_job_exits_3(env_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "j-doesnotexist"]) == 3
    assert capsys.readouterr().err == "gpujobs: no job j-doesnotexist\n"


def test_status_watch_follows_the_job_until_it_ends(
    env_stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = env_stack.add_job("j-0000000000000002")

    def user_cancels(seconds: float) -> None:
        current = env_stack.store.get(job.job_id)
        env_stack.store.save(current.transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=NOW))

    monkeypatch.setattr(commands, "sleep", user_cancels)

    code = main(["status", job.job_id, "--watch"])

    out = capsys.readouterr().out
    assert code == 1
    assert out.index("state     QUEUED") < out.index("state     CANCELLED")


def test_list_shows_active_jobs_newest_first_and_all_with_state_all(
    env_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    env_stack.add_job("j-old", at=NOW)
    env_stack.add_job("j-new", example="cpu-smoke.json", at=NOW + timedelta(hours=1))
    done = env_stack.add_job("j-done", at=NOW + timedelta(hours=2))
    env_stack.store.save(stopped_by_budget(done, now=NOW + timedelta(hours=2)))

    assert main(["list"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("JOB ID")
    assert [r.split()[0] for r in rows[1:]] == ["j-new", "j-old"]

    assert main(["list", "--state", "all", "--json"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)] == ["j-done", "j-new", "j-old"]

    assert main(["list", "--state", "stopped", "--limit", "1", "--json"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)] == ["j-done"]


def test_list_with_no_jobs_says_so(env_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    assert capsys.readouterr().out == "no jobs in QUEUED, LAUNCHING, RUNNING, INTERRUPTED\n"


# ---- cancel ----------------------------------------------------------------------------------
def test_cancel_sends_the_cancel_message(env_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    env_stack.add_job("j-0000000000000003")

    assert main(["cancel", "j-0000000000000003"]) == 0

    assert env_stack.messages() == [{"cancel_job_id": "j-0000000000000003"}]
    assert "cancellation requested for j-0000000000000003" in capsys.readouterr().out


def test_cancel_of_an_ended_job_sends_nothing(env_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    job = env_stack.add_job("j-0000000000000004")
    env_stack.store.save(job.transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=NOW))

    assert main(["cancel", job.job_id, "--json"]) == 0

    assert json.loads(capsys.readouterr().out) == {
        "job_id": job.job_id,
        "state": "CANCELLED",
        "cancel_requested": False,
    }
    assert env_stack.messages() == []


def test_cancel_of_a_failed_job_whose_gang_is_kept_asks_to_release_it_until_the_keep_is_over(
    env_stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = env_stack.add_job("j-0000000000000006")
    kept = Kept(attempt=1, since=NOW, until=NOW + timedelta(minutes=30))
    env_stack.store.save(job.model_copy(update={"state": JobState.FAILED, "kept": kept}))

    monkeypatch.setattr(commands, "utc_now", lambda: NOW + timedelta(minutes=10))
    assert main(["cancel", job.job_id]) == 0
    assert (
        "release of j-0000000000000006's gang kept for inspection requested (stays FAILED)" in capsys.readouterr().out
    )
    assert env_stack.messages() == [{"cancel_job_id": job.job_id}]

    monkeypatch.setattr(commands, "utc_now", lambda: NOW + timedelta(minutes=30))
    assert main(["cancel", job.job_id]) == 0
    assert "is already FAILED; nothing to cancel" in capsys.readouterr().out
    assert env_stack.messages() == []


def test_cancel_of_an_unknown_job_exits_3_and_sends_nothing(
    env_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cancel", "j-nope"]) == 3
    assert env_stack.messages() == []


# ---- resource discovery ----------------------------------------------------------------------
def create_stack(name: str, outputs: dict[str, str]) -> None:
    template = {
        "Resources": {"Placeholder": {"Type": "AWS::SQS::Queue"}},  # CloudFormation needs one resource
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    boto3.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


def test_queue_and_table_come_from_the_stack_outputs(
    stack_resources: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    create_stack(
        "gpujobs-dev",
        {
            "JobsQueueUrl": stack_resources.queue_url,
            "JobsTableName": stack_resources.table_name,
            "EventBusName": "gpujobs-bus",
            "CheckpointBucketName": "gpujobs-ckpt",
        },
    )
    stack_resources.add_job("j-0000000000000005")

    assert main(["--stack", "gpujobs-dev", "cancel", "j-0000000000000005"]) == 0
    assert main(["list", "--stack", "gpujobs-dev", "--json"]) == 0

    assert [j["job_id"] for j in json.loads(capsys.readouterr().out.split("\n", 1)[1])] == ["j-0000000000000005"]
    assert stack_resources.messages() == [{"cancel_job_id": "j-0000000000000005"}]


def test_the_stack_name_can_come_from_the_environment(
    stack_resources: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    create_stack("team-a", {"JobsQueueUrl": stack_resources.queue_url, "JobsTableName": stack_resources.table_name})
    monkeypatch.setenv("GPUJOBS_STACK", "team-a")

    assert main(["list"]) == 0


def test_env_overrides_mean_cloudformation_is_not_asked(
    env_stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # no stack exists at all: a call to CloudFormation would fail with "stack not found"
    assert main(["--stack", "does-not-exist", "list"]) == 0
    assert main(["--stack", "does-not-exist", "submit", str(EXAMPLES / "digits.yaml")]) == 0


def test_a_missing_stack_is_one_line_that_names_the_overrides(
    stack_resources: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["list"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "stack 'gpujobs' not found" in err
    assert "GPUJOBS_QUEUE_URL" in err
    assert "GPUJOBS_TABLE" in err


def test_a_stack_without_the_needed_output_is_a_config_error(
    stack_resources: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    create_stack("gpujobs", {"JobsQueueUrl": stack_resources.queue_url})

    assert main(["list"]) == 2
    assert "has no output JobsTableName" in capsys.readouterr().err


def test_an_aws_error_is_one_line_not_a_traceback(
    aws: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUJOBS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/missing")
    monkeypatch.setenv("GPUJOBS_TABLE", "missing-table")

    code = main(["status", "j-0000000000000006"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("gpujobs: ")
    assert err.count("\n") == 1
    assert "ResourceNotFoundException" in err


# ---- a client_token names one spec --------------------------------------------------------------
def test_submit_wait_refuses_a_token_that_names_a_job_with_a_different_spec_and_sends_nothing(
    env_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = job_id_for(client_token="nightly-1", team="default", message_id=None)
    env_stack.add_job(job_id, example="cpu-smoke.json")

    code = main(["submit", str(EXAMPLES / "digits.yaml"), "--client-token", "nightly-1", "--wait"])

    assert code == 1
    err = capsys.readouterr().err
    assert f"already names job {job_id} with a different spec" in err
    assert env_stack.messages() == []


def test_submit_wait_reports_this_messages_rejection_not_the_job_its_token_names(
    env_stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given the token's job appears (another submitter's, with another spec) just as this message is rejected
    job_id = job_id_for(client_token="nightly-1", team="default", message_id=None)

    def a_conflict_is_recorded(seconds: float) -> None:
        (message,) = env_stack.sqs.receive_message(QueueUrl=env_stack.queue_url)["Messages"]
        env_stack.add_job(job_id, example="cpu-smoke.json")
        rejected_id = job_id_for(client_token=None, team=None, message_id=message["MessageId"])
        conflict = f"client_token: 'nightly-1' of team 'default' already names job {job_id} with a different spec"
        env_stack.store.create(
            Job.rejected(job_id=rejected_id, problems=[conflict], excerpt="", now=NOW, message_id="m")
        )

    monkeypatch.setattr(commands, "sleep", a_conflict_is_recorded)

    code = main(["submit", str(EXAMPLES / "digits.yaml"), "--client-token", "nightly-1", "--wait", "--json"])

    assert code == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["job"]["state"] == "REJECTED"
    assert printed["job"]["problems"][0].startswith("client_token: ")
