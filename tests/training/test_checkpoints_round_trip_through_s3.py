"""Story: a job on S3 (moto) is preempted, and a replacement machine with an empty disk resumes it
exactly from S3, while the trainer reports its progress on the EventBridge bus."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from gpujobs_trainer import PREEMPTED_EXIT_CODE
from tests.training.conftest import Baseline
from tests.training.harness import TOTAL_STEPS, JobResult, assert_bit_identical, job_env, run_job, start_job

pytestmark = [pytest.mark.training, pytest.mark.integration]
BUCKET = "ckpt-bucket"
BUS = "gpujobs-test-bus"


@pytest.fixture(scope="module")
def aws_env() -> Iterator[dict[str, str]]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    server.stop()


def _client(service: str, aws_env: dict[str, str]) -> Any:
    return boto3.client(
        service,
        endpoint_url=aws_env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@dataclass(frozen=True)
class PreemptedOnS3:
    interrupted: JobResult
    resumed: JobResult
    preempted_step: int
    keys: list[str]
    events: list[dict[str, Any]]
    new_machine_dir: Path
    dump: Path


@pytest.fixture(scope="module")
def preempted_on_s3(aws_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> PreemptedOnS3:
    root = tmp_path_factory.mktemp("s3story")
    _client("s3", aws_env).create_bucket(Bucket=BUCKET)
    events, sqs = _client("events", aws_env), _client("sqs", aws_env)
    events.create_event_bus(Name=BUS)
    queue_url = sqs.create_queue(QueueName="trainer-events")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(
        Name="all-trainer-events", EventBusName=BUS, EventPattern=json.dumps({"source": ["gpujobs.trainer"]})
    )
    events.put_targets(Rule="all-trainer-events", EventBusName=BUS, Targets=[{"Id": "q", "Arn": queue_arn}])

    uri = f"s3://{BUCKET}/jobs/job-test/ckpt"
    common = {**aws_env, "GPUJOBS_EVENT_BUS": BUS, "GPUJOBS_HEARTBEAT_SECONDS": "0.5"}
    first_machine = job_env(uri, GPUJOBS_LOCAL_CHECKPOINT_DIR=str(root / "machine-a"), **common)
    job = start_job(first_machine, "--steps", str(TOTAL_STEPS), "--step-sleep", "0.02")
    job.wait_for_step(100)
    job.signal(signal.SIGTERM)
    interrupted = job.finish()
    assert interrupted.exit_code == PREEMPTED_EXIT_CODE, interrupted.output
    preempted_step = int(
        next(line for line in interrupted.lines if "committed (preempted)" in line)
        .split("checkpoint step ")[1]
        .split()[0]
    )

    new_machine_dir = root / "machine-b"  # empty disk: everything must come from S3
    dump = root / "resumed.pt"
    second_machine = job_env(uri, GPUJOBS_LOCAL_CHECKPOINT_DIR=str(new_machine_dir), GPUJOBS_ATTEMPT="2", **common)
    resumed = run_job(second_machine, "--steps", str(TOTAL_STEPS), "--state-dump", str(dump))

    listed = _client("s3", aws_env).list_objects_v2(Bucket=BUCKET, Prefix="jobs/job-test/ckpt/")
    keys = sorted(obj["Key"] for obj in listed.get("Contents", []))
    received = []
    while batch := sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
        for message in batch:
            received.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return PreemptedOnS3(interrupted, resumed, preempted_step, keys, received, new_machine_dir, dump)


def test_a_replacement_machine_with_an_empty_disk_resumes_exactly_from_s3(
    preempted_on_s3: PreemptedOnS3, baseline: Baseline
) -> None:
    story = preempted_on_s3
    assert story.resumed.exit_code == 0, story.resumed.output
    assert story.resumed.resumed_from == story.preempted_step
    assert 100 <= story.preempted_step < TOTAL_STEPS
    assert_bit_identical(baseline.state_dump, story.dump)


def test_s3_holds_committed_step_folders_with_every_rank_shard_and_the_marker(
    preempted_on_s3: PreemptedOnS3,
) -> None:
    prefix = "jobs/job-test/ckpt/"
    final = f"{prefix}step-{TOTAL_STEPS:08d}/"
    preempted = f"{prefix}step-{preempted_on_s3.preempted_step:08d}/"
    for folder in (preempted, final):
        names = {key[len(folder) :] for key in preempted_on_s3.keys if key.startswith(folder)}
        assert {"COMMIT.json", ".metadata", "rng-rank-00000.json", "rng-rank-00001.json"} <= names
        shards = {n for n in names if n.endswith(".distcp")}
        assert {n.split("_")[2] for n in shards} == {"0", "1"}  # every rank uploaded its own shards
    assert {k.split("/")[3] for k in preempted_on_s3.keys} == {preempted.split("/")[3], final.split("/")[3]}


def test_the_trainer_reports_commits_heartbeats_and_exits_on_the_bus(preempted_on_s3: PreemptedOnS3) -> None:
    events = preempted_on_s3.events
    assert all(e["source"] == "gpujobs.trainer" for e in events)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_type.setdefault(event["detail-type"], []).append(event["detail"])

    commits = by_type["Checkpoint Committed"]
    assert {
        "job_id": "job-test",
        "attempt": 1,
        "step": preempted_on_s3.preempted_step,
        "uri": f"s3://{BUCKET}/jobs/job-test/ckpt/step-{preempted_on_s3.preempted_step:08d}",
        "reason": "preempted",
    } in commits
    assert any(c["reason"] == "final" and c["attempt"] == 2 and c["step"] == TOTAL_STEPS for c in commits)

    exits = sorted(by_type["Job Exited"], key=lambda e: e["attempt"])
    assert exits == [
        {"job_id": "job-test", "attempt": 1, "node_rank": 0, "exit_code": 75, "reason": "preempted"},
        {"job_id": "job-test", "attempt": 2, "node_rank": 0, "exit_code": 0, "reason": "succeeded"},
    ]
    heartbeat = by_type["Training Heartbeat"][0]
    assert set(heartbeat) == {"job_id", "attempt", "step", "steps_per_second", "samples_per_second", "metrics", "time"}
    assert heartbeat["steps_per_second"] > 0
    assert heartbeat["samples_per_second"] == pytest.approx(heartbeat["steps_per_second"] * 64, rel=1e-2)


def test_rank_zeros_heartbeats_carry_the_loss_and_learning_rate_the_script_logged(
    preempted_on_s3: PreemptedOnS3,
) -> None:
    # the digits script passes step_done(metrics={"loss": loss, "lr": ...}) on every rank of 2
    beats = [e["detail"] for e in preempted_on_s3.events if e["detail-type"] == "Training Heartbeat"]
    logged = [b["metrics"] for b in beats if b.get("busy") is None]

    assert logged
    assert all(set(m) == {"loss", "lr"} for m in logged)
    assert all(0 < m["loss"] < 10 and 0 < m["lr"] <= 1 for m in logged)
    assert len({m["loss"] for m in logged}) > 1  # the newest value at each heartbeat, not a constant
    assert {b["attempt"] for b in beats} == {1, 2}  # the resumed run reports them too
