"""The local cloud: template.yaml's event sources driving the real handlers against a moto server.

Each test starts its own cloud (a moto server on 127.0.0.1, the stack built from the template) and
checks on teardown that stop() left no port open, no thread running and os.environ as it was.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpujobs_local.cloud import Delivery, LocalCloud

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BUDGET_MESSAGE = (
    "AWS Budget Notification November 29, 2026\nAWS Account 123456789012\n\nDear AWS Customer,\n\n"
    "You requested that we alert you when the ACTUAL Cost associated with your {name} budget is greater "
    "than $100.00 for the current month. The ACTUAL Cost associated with this budget is $120.00. You can "
    "find additional details below and by accessing the AWS Budgets dashboard [1].\n\n"
    "Budget Name: {name}\nBudget Type: Cost\nBudgeted Amount: $100.00\nAlert Type: ACTUAL\n"
    "Alert Threshold: > $100.00\nACTUAL Amount: $120.00\n\n[1] https://console.aws.amazon.com/billing/home#/budgets\n"
)


def port_is_open(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


class Recorder:
    def __init__(self) -> None:
        self.seen: list[Delivery] = []
        self.lock = threading.Lock()

    def __call__(self, delivery: Delivery) -> None:
        with self.lock:
            self.seen.append(delivery)

    def to(self, function: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.seen if d.function == function]


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[LocalCloud]:
    env_before = dict(os.environ)
    threads_before = set(threading.enumerate())
    local = LocalCloud(workdir=tmp_path / "cloud", reconcile_every=3600, retry_delay=0, poll_interval=0.05)
    local.start()
    local.start()  # idempotent
    url = local.endpoint_url
    assert url.startswith("http://127.0.0.1:")
    try:
        yield local
    finally:
        local.stop()
        local.stop()  # idempotent
        assert not port_is_open(url)
        assert dict(os.environ) == env_before
        deadline = time.monotonic() + 10
        while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not (set(threading.enumerate()) - threads_before)


def recorded(cloud: LocalCloud) -> Recorder:
    recorder = Recorder()
    cloud.on_delivery(recorder)
    return recorder


def job_instances(cloud: LocalCloud) -> list[dict[str, Any]]:
    assert cloud.stack is not None
    return cloud.stack.instances()


@pytest.mark.timeout(120)
def test_a_spec_sent_to_the_queue_is_recorded_and_launched(cloud: LocalCloud) -> None:
    from gpujobs.adapters.dynamodb import DynamoJobStore
    from gpujobs.domain.states import JobState

    seen = recorded(cloud)
    sqs = cloud.client("sqs")
    sqs.send_message(QueueUrl=cloud.outputs["JobsQueueUrl"], MessageBody=(ROOT / "examples/digits.yaml").read_text())

    cloud.wait_until(lambda: bool(seen.to("SubmitFunction")), timeout=30, what="the submit function")
    (instance,) = job_instances(cloud)
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    store = DynamoJobStore(table_name=cloud.outputs["JobsTableName"], client=cloud.client("dynamodb"))
    assert store.get(tags["gpujobs:job-id"]).state is JobState.RUNNING
    assert instance["InstanceType"] == "g5.xlarge"
    # the spot ladder asked EC2's advice (answered by the local cloud: every zone alike, so the
    # subnets' order stands) and went on to launch
    assert cloud.stack is not None
    assert cloud.stack.spot_scores.asked >= 1
    (submit,) = seen.to("SubmitFunction")
    assert submit.kind == "SQS"
    assert submit.ok
    cloud.wait_until(
        lambda: (
            sqs.get_queue_attributes(
                QueueUrl=cloud.outputs["JobsQueueUrl"], AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
            )["Attributes"]["ApproximateNumberOfMessagesNotVisible"]
            == "0"
        ),
        timeout=10,
        what="the message to be deleted",
    )


@pytest.mark.timeout(120)
def test_state_changes_reach_the_instance_state_function_through_the_rule_pattern(cloud: LocalCloud) -> None:
    seen = recorded(cloud)
    for state in ("pending", "running"):
        cloud.put_event(
            source="aws.ec2",
            detail_type="EC2 Instance State-change Notification",
            detail={"instance-id": "i-0123456789abcdef0", "state": state},
            resources=["arn:aws:ec2:us-east-1:123456789012:instance/i-0123456789abcdef0"],
        )
    cloud.wait_until(lambda: bool(seen.to("InstanceStateFunction")), timeout=30, what="InstanceStateFunction")
    time.sleep(0.3)  # a pending event, had it matched, would have been delivered first
    (delivery,) = seen.to("InstanceStateFunction")
    assert delivery.kind == "EC2 Instance State-change Notification"
    assert delivery.event["detail"]["state"] == "running"
    assert delivery.event["account"] == "123456789012"  # put back: moto's SQS target drops it
    assert delivery.ok, delivery.outcome
    assert not seen.to("SpotFunction")


@pytest.mark.timeout(120)
def test_a_capacity_error_on_g5_spot_moves_the_job_to_the_next_rung(cloud: LocalCloud) -> None:
    cloud.inject_capacity_error(instance_type="g5.xlarge", market="spot")
    cloud.client("sqs").send_message(
        QueueUrl=cloud.outputs["JobsQueueUrl"], MessageBody=(ROOT / "examples/digits-2node.yaml").read_text()
    )
    seen = recorded(cloud)
    cloud.wait_until(lambda: len(seen.to("SubmitFunction")) == 1, timeout=30, what="the two-node gang")
    assert {i["InstanceType"] for i in job_instances(cloud)} == {"g6.xlarge"}
    assert {i.get("InstanceLifecycle") for i in job_instances(cloud)} == {"spot"}

    cloud.clear_faults()
    spec = (ROOT / "examples/digits.yaml").read_text().replace("name: digits", "name: digits-again")
    cloud.client("sqs").send_message(QueueUrl=cloud.outputs["JobsQueueUrl"], MessageBody=spec)
    cloud.wait_until(lambda: len(seen.to("SubmitFunction")) == 2, timeout=30, what="the next job")
    assert "g5.xlarge" in {i["InstanceType"] for i in job_instances(cloud)}


@pytest.mark.timeout(120)
def test_a_failing_handler_is_retried_then_dead_lettered(cloud: LocalCloud) -> None:
    seen = recorded(cloud)
    # An AWS event in a shape the handler does not know (only AWS can put aws.* events on the
    # default bus): it fails, so a schema change surfaces in the dead-letter queue. A malformed
    # *report*, which any job could send, is consumed instead (docs/security.md).
    cloud.put_event(
        source="aws.ec2",
        detail_type="EC2 Spot Instance Interruption Warning",
        detail={"instance-id": "i-0123456789abcdef0", "instance-action": "explode"},  # fails validation
    )
    cloud.wait_until(lambda: bool(cloud.dead_letters()), timeout=30, what="a dead letter")
    (letter,) = cloud.dead_letters()
    assert letter["requestContext"]["condition"] == "RetriesExhausted"
    assert letter["requestPayload"]["detail-type"] == "EC2 Spot Instance Interruption Warning"
    assert letter["responsePayload"]["errorType"] == "ValidationError"
    tries = seen.to("SpotFunction")
    assert [d.attempt for d in tries] == [1, 2, 3]  # EventInvokeConfig.MaximumRetryAttempts: 2
    assert [d.dead_lettered for d in tries] == [False, False, True]
    time.sleep(0.3)
    assert len(seen.to("SpotFunction")) == 3  # not retried forever


@pytest.mark.timeout(120)
def test_a_budget_alert_on_the_topic_holds_launches(cloud: LocalCloud) -> None:
    from gpujobs.adapters.budgets import DynamoBudgetBook
    from gpujobs.domain.budget import BudgetMode

    seen = recorded(cloud)
    name = f"gpujobs-{cloud.stack_name}-all"
    cloud.client("sns").publish(
        TopicArn=cloud.outputs["BudgetAlertsTopicArn"],
        Subject=f"AWS Budgets: {name} has exceeded your alert threshold",
        Message=BUDGET_MESSAGE.format(name=name),
    )
    cloud.wait_until(lambda: bool(seen.to("BudgetFunction")), timeout=30, what="BudgetFunction")
    (delivery,) = seen.to("BudgetFunction")
    assert delivery.kind == "SNS"
    assert delivery.ok, delivery.outcome
    book = DynamoBudgetBook(table_name=cloud.outputs["JobsTableName"], client=cloud.client("dynamodb"))
    assert [(p.scope, p.mode) for p in book.held_scopes()] == [("all", BudgetMode.HOLD)]


@pytest.mark.timeout(120)
def test_the_gpujobs_cli_works_against_the_exports(
    cloud: LocalCloud, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpujobs_cli.main import main

    seen = recorded(cloud)
    for key, value in cloud.exports().items():
        monkeypatch.setenv(key, value)
    assert main(["submit", str(ROOT / "examples/digits.yaml")]) == 0
    cloud.wait_until(lambda: bool(seen.to("SubmitFunction")), timeout=30, what="the submit function")
    capsys.readouterr()
    assert main(["list", "--state", "all"]) == 0
    listing = capsys.readouterr().out
    assert "digits" in listing
    assert "RUNNING" in listing
    assert (cloud.workdir / "env.sh").read_text().count("export ") == len(cloud.exports())


def test_the_exports_carry_credentials_generated_for_this_run_readable_only_by_the_user(cloud: LocalCloud) -> None:
    exports = cloud.exports()
    key, secret = exports["AWS_ACCESS_KEY_ID"], exports["AWS_SECRET_ACCESS_KEY"]
    assert (key, secret) == (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    assert not {key, secret} & {"local", "testing", "demo"}
    assert len(secret) >= 30
    env_sh = cloud.workdir / "env.sh"
    assert f"export AWS_SECRET_ACCESS_KEY={secret}\n" in env_sh.read_text()
    assert stat.S_IMODE(env_sh.stat().st_mode) == 0o600


@pytest.mark.timeout(120)
def test_the_reconciler_runs_on_demand_and_on_schedule(tmp_path: Path) -> None:
    with LocalCloud(workdir=tmp_path, reconcile_every=0.5, poll_interval=0.05) as cloud:
        seen = recorded(cloud)
        assert cloud.run_reconciler() == {"active_jobs": 0, "live_instances": 0, "repairs": {}}
        cloud.wait_until(lambda: len(seen.to("ReconcilerFunction")) >= 3, timeout=20, what="scheduled ticks")
        assert all(d.kind == "Scheduled Event" and d.ok for d in seen.to("ReconcilerFunction"))
        ticks: list[float] = []
        cloud.add_tick(lambda: ticks.append(time.monotonic()))
        cloud.wait_until(lambda: len(ticks) >= 3, timeout=10, what="ticks")
        url, env = cloud.endpoint_url, json.dumps(cloud.exports())
    assert not port_is_open(url)
    assert os.environ.get("AWS_ENDPOINT_URL") != json.loads(env)["AWS_ENDPOINT_URL"]


@pytest.mark.timeout(120)
def test_a_report_forged_by_another_job_is_consumed_and_changes_nothing(cloud: LocalCloud) -> None:
    """Any job may put events on the stack's bus; only the instances of the attempt a report names
    hold the key that proves it (the report secret lives in the moto server's Secrets Manager)."""
    from gpujobs.adapters.dynamodb import DynamoJobStore
    from gpujobs.domain.states import JobState

    assert cloud.stack is not None
    seen = recorded(cloud)
    cloud.client("sqs").send_message(
        QueueUrl=cloud.outputs["JobsQueueUrl"], MessageBody=(ROOT / "examples/digits.yaml").read_text()
    )
    cloud.wait_until(lambda: bool(job_instances(cloud)), timeout=30, what="the job's instance")
    (instance,) = job_instances(cloud)
    iid = instance["InstanceId"]
    job_id = {t["Key"]: t["Value"] for t in instance["Tags"]}["gpujobs:job-id"]
    store = DynamoJobStore(table_name=cloud.outputs["JobsTableName"], client=cloud.client("dynamodb"))
    exit_1 = {"job_id": job_id, "attempt": 1, "node_rank": 0, "instance_id": iid, "exit_code": 1, "reason": "x"}

    cloud.put_event(
        source="gpujobs.instance", detail_type="Job Exited", detail=exit_1, bus=cloud.outputs["EventBusName"]
    )
    cloud.wait_until(lambda: bool(seen.to("ReportsFunction")), timeout=30, what="ReportsFunction")
    (forged,) = seen.to("ReportsFunction")
    assert forged.ok, forged.outcome  # consumed, not retried
    assert store.get(job_id).state is JobState.RUNNING
    assert store.get(job_id).attempt(1).exit_codes == {}  # type: ignore[union-attr]

    signed = cloud.stack.signed_by(iid, "Job Exited", exit_1)  # what the instance itself would send
    cloud.put_event(
        source="gpujobs.instance", detail_type="Job Exited", detail=signed, bus=cloud.outputs["EventBusName"]
    )
    cloud.wait_until(lambda: len(seen.to("ReportsFunction")) == 2, timeout=30, what="the signed report")
    assert store.get(job_id).attempt(1).exit_codes == {iid: 1}  # type: ignore[union-attr]


@pytest.mark.timeout(120)
def test_a_message_sent_as_another_principal_reaches_the_submit_function_with_its_sender_id(
    cloud: LocalCloud,
) -> None:
    from gpujobs_local.stack import MOTO_SENDER

    seen = recorded(cloud)
    body = (ROOT / "examples/digits.yaml").read_text()

    as_mallory = cloud.send(body.replace("name: digits", "name: digits-mallory"), sender="AROAMALLORYEXAMPLE01:m")
    as_moto = cloud.send(body)

    cloud.wait_until(
        lambda: sum(len(d.event["Records"]) for d in seen.to("SubmitFunction")) == 2, timeout=30, what="both messages"
    )
    senders = {
        r["messageId"]: r["attributes"]["SenderId"] for d in seen.to("SubmitFunction") for r in d.event["Records"]
    }
    assert senders == {as_mallory: "AROAMALLORYEXAMPLE01:m", as_moto: MOTO_SENDER}
