"""`gpujobs metrics` and `gpujobs tensorboard` against moto: a user follows a job's training.

`metrics` prints the series recorded on the job's record; `tensorboard` downloads the event files
the job wrote under `$GPUJOBS_TB_DIR` (uploaded with its outputs) and serves them with a local
TensorBoard, or, where none is installed, says where they are and how to install it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.contract import TENSORBOARD_OUTPUTS, outputs_prefix
from gpujobs.domain.decisions import on_heartbeat
from gpujobs.domain.job import Attempt, Job, Market
from gpujobs.domain.reports import HeartbeatReport
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli.main import main
from gpujobs_local.template import table_definition

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUCKET, TABLE, JOB = "gpujobs-checkpoints", "gpujobs-jobs", "j-00000000000000aa"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
EVENTS = "events.out.tfevents.1717243200.node0"


@dataclass
class Cloud:
    s3: Any
    store: DynamoJobStore

    def put(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=BUCKET, Key=outputs_prefix(JOB, team="default") + key, Body=body)

    def add_training_job(self, *steps: int) -> None:
        spec = load_spec((EXAMPLES / "digits.yaml").read_bytes())
        job = Job.submitted(job_id=JOB, spec=spec, now=NOW, message_id=None)
        job = job.with_attempt(Attempt(number=1, started_at=NOW, instance_ids=("i-1",), market=Market.SPOT), now=NOW)
        job = job.transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=NOW)
        job = job.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=NOW)
        for minute, step in enumerate(steps, start=1):
            report = HeartbeatReport(
                job_id=JOB, attempt=1, step=step, metrics=(("loss", 2.0 / step),), steps_per_second=4.0
            )
            decided = on_heartbeat(job, report, now=NOW + timedelta(minutes=minute))
            assert decided.job is not None
            job = decided.job
        self.store.create(job)


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Cloud]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "GPUJOBS_BUCKET": BUCKET,
        "GPUJOBS_TABLE": TABLE,
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "GPUJOBS_STACK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no tensorboard unless a test puts one there
    with mock_aws():
        s3, ddb = boto3.client("s3"), boto3.client("dynamodb")
        s3.create_bucket(Bucket=BUCKET)
        ddb.create_table(**table_definition(table_name=TABLE))
        yield Cloud(s3, DynamoJobStore(table_name=TABLE, client=ddb))


def test_metrics_prints_the_recorded_series_in_text_and_json(cloud: Cloud, capsys: pytest.CaptureFixture[str]) -> None:
    cloud.add_training_job(100, 200, 400)

    assert main(["metrics", JOB]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["TIME", "ATTEMPT", "STEP", "LOSS", "STEPS/S", "SAMPLES/S"]
    assert [row.split()[3:6] for row in rows[1:]] == [["100", "0.02", "4"], ["200", "0.01", "4"], ["400", "0.005", "4"]]

    assert main(["metrics", JOB, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(p["step"], p["metrics"]["loss"]) for p in shown["points"]] == [(100, 0.02), (200, 0.01), (400, 0.005)]
    assert shown["points"][-1]["at"] == "2025-06-01T12:03:00Z"
    assert shown["dropped"] == 0


def test_metrics_of_an_unknown_job_is_not_found(cloud: Cloud, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["metrics", "j-00000000000000ff"]) == 3
    assert "no job j-00000000000000ff" in capsys.readouterr().err


def test_tensorboard_without_tensorboard_installed_downloads_the_files_and_says_how_to_install(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cloud.add_training_job(100)
    cloud.put(TENSORBOARD_OUTPUTS + EVENTS, b"\x00event-bytes")
    cloud.put(TENSORBOARD_OUTPUTS + "eval/" + EVENTS, b"\x00eval-bytes")
    cloud.put("model.safetensors", b"weights")  # an output, not TensorBoard's

    code = main(["tensorboard", JOB])

    err = capsys.readouterr().err
    folder = tmp_path / f"{JOB}-tensorboard"
    assert code == 0
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [f"eval/{EVENTS}", EVENTS]
    assert (folder / EVENTS).read_bytes() == b"\x00event-bytes"
    assert f"TensorBoard is not installed: pip install tensorboard, then: tensorboard --logdir {JOB}-tensorboard" in err


def test_tensorboard_serves_the_downloaded_folder_with_the_local_tensorboard(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cloud.add_training_job(100)
    cloud.put(TENSORBOARD_OUTPUTS + EVENTS, b"\x00event-bytes")
    called = tmp_path / "argv.txt"
    fake = tmp_path / "bin" / "tensorboard"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {called}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)

    assert main(["tensorboard", JOB, "--dir", "runs; rm -rf ~", "--port", "6007"]) == 0

    assert called.read_text().splitlines() == ["--logdir", "runs; rm -rf ~", "--port", "6007"]  # argv, no shell
    assert (tmp_path / "runs; rm -rf ~" / EVENTS).exists()
    assert "http://localhost:6007/" in capsys.readouterr().err


def test_tensorboard_before_any_event_file_was_uploaded_says_when_they_will_be(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud.add_training_job(100)

    assert main(["tensorboard", JOB]) == 1
    err = capsys.readouterr().err
    assert f"{JOB} (RUNNING) has no TensorBoard files in s3://{BUCKET}/outputs/default/{JOB}/tensorboard/ yet" in err
    assert "$GPUJOBS_TB_DIR" in err


def test_tensorboard_skips_a_key_that_would_land_outside_the_folder(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cloud.add_training_job(100)
    cloud.put(TENSORBOARD_OUTPUTS + EVENTS, b"\x00event-bytes")
    cloud.put(TENSORBOARD_OUTPUTS + "../../escape", b"x")

    assert main(["tensorboard", JOB, "--no-serve"]) == 1

    assert "skipping '../../escape'" in capsys.readouterr().err
    assert not any(p.name == "escape" for p in tmp_path.rglob("*"))
    assert os.path.exists(tmp_path / f"{JOB}-tensorboard" / EVENTS)
