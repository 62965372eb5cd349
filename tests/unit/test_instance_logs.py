"""What a node prints outlives it: the workload's output and the bootstrap's log reach CloudWatch Logs.

The bootstrap runs as a plain process against a fake IMDSv2 and a moto server, as on the local
cloud (process runtime: its own shipper); on EC2, docker's awslogs driver ships the container's
output, which the argv test pins.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from gpujobs.contract import bootstrap_log_stream, job_log_stream
from gpujobs.domain.rundoc import RunDocument
from gpujobs.instance import rundoc, runtimes
from gpujobs.instance.contract import EXIT_BOOTSTRAP_FAILED
from gpujobs.instance.userdata import bootstrap_command, render_user_data, unpack_bootstrap
from tests.conftest import BootstrapPython
from tests.unit.fake_imds import FakeImds

GROUP = "/gpujobs/test/jobs"
INSTANCE_ID = "i-0aaaabbbbccccdddd"
PRINTS_AND_FAILS = "import sys; print('epoch 1 loss 0.9', flush=True); print('boom', file=sys.stderr); sys.exit(3)"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


@pytest.fixture
def logs(moto_endpoint: str) -> Any:
    client = boto3.client("logs", endpoint_url=moto_endpoint, **CREDENTIALS)
    for group in client.describe_log_groups(logGroupNamePrefix=GROUP)["logGroups"]:
        client.delete_log_group(logGroupName=group["logGroupName"])
    client.create_log_group(logGroupName=GROUP)
    return client


def messages(logs: Any, stream: str) -> list[str]:
    page = logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True)
    return [e["message"] for e in page["events"]]


def run_bootstrap(
    tmp_path: Path, moto_endpoint: str, doc: RunDocument, *args: str, python: str = sys.executable
) -> tuple[int, str]:
    """The bundled bootstrap under `python`, as the loader runs it."""
    bundle = unpack_bootstrap(tmp_path / "bootstrap")
    with FakeImds(
        user_data=render_user_data(doc, bucket="unused", region="us-east-1"), instance_id=INSTANCE_ID
    ) as imds:
        done = subprocess.run(
            [*bootstrap_command(python, bundle), "--runtime", "process", "--no-shutdown", *args],
            env={
                "PATH": "/usr/bin:/bin",
                "AWS_ENDPOINT_URL": moto_endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    return done.returncode, done.stdout + done.stderr


def a_document(**changes: Any) -> RunDocument:
    fields: dict[str, Any] = {
        "job_id": "j-0123456789abcdef",
        "attempt": 2,
        "name": "demo",
        "image": "unused-by-the-process-runtime",
        "command": [sys.executable, "-c", PRINTS_AND_FAILS],
        "gpus_per_node": 0,
        "checkpoint_uri": "s3://bucket/jobs/j-0123456789abcdef/ckpt",
        "region": "us-east-1",
        "team": "vision",
        "log_group": GROUP,
    }
    return RunDocument(**{**fields, **changes})


def test_the_workload_output_and_the_bootstrap_log_reach_the_nodes_streams(
    tmp_path: Path, moto_endpoint: str, logs: Any, bootstrap_python: BootstrapPython
) -> None:
    code, output = run_bootstrap(tmp_path, moto_endpoint, a_document(), python=bootstrap_python.path)

    assert code == 3, output
    # stdout and stderr are two pipes, read by two threads (as docker reads them): each keeps its order,
    # not their order relative to each other
    assert sorted(messages(logs, job_log_stream("j-0123456789abcdef", 2, 0, team="vision"))) == [
        "boom",
        "epoch 1 loss 0.9",
    ]
    bootstrap_lines = messages(logs, bootstrap_log_stream("j-0123456789abcdef", 2, 0, team="vision"))
    assert f"gpujobs-bootstrap: Python {bootstrap_python.version} at " in bootstrap_lines[0]
    assert "gpujobs-bootstrap: job j-0123456789abcdef attempt 2 on " + INSTANCE_ID in bootstrap_lines[1]
    assert any(line.endswith("gpujobs-bootstrap: exited: workload exited with 3: boom") for line in bootstrap_lines)
    assert bootstrap_lines[-1].endswith("no event bus or region known: the exit is not published")
    assert "epoch 1 loss 0.9" in output  # still in the instance's own log too


def test_a_bootstrap_that_fails_before_its_rendezvous_still_leaves_its_log(
    tmp_path: Path, moto_endpoint: str, logs: Any
) -> None:
    code, output = run_bootstrap(tmp_path, moto_endpoint, a_document(nodes=2), "--rendezvous-timeout", "0")

    assert code == EXIT_BOOTSTRAP_FAILED, output
    lines = messages(logs, bootstrap_log_stream("j-0123456789abcdef", 2, 0, team="vision"))  # node: its launch index
    assert any("bootstrap-failed: BootstrapError: rendezvous: 0 of 2 instances" in line for line in lines)


def test_without_a_log_group_nothing_is_shipped(tmp_path: Path, moto_endpoint: str, logs: Any) -> None:
    code, output = run_bootstrap(tmp_path, moto_endpoint, a_document(log_group=""))

    assert code == 3, output
    assert logs.describe_log_streams(logGroupName=GROUP)["logStreams"] == []


def test_docker_ships_the_container_output_with_the_awslogs_driver_without_blocking(tmp_path: Path) -> None:
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    docker.chmod(0o755)
    doc = rundoc.check_document(a_document().model_dump(mode="json"))
    runtime = runtimes.DockerRuntime(str(docker))
    runtime.send_output_to(group=GROUP, stream="j-0123456789abcdef/2/1", region="eu-west-1", clients=lambda _: None)

    argv = " ".join(runtime.log_options)

    assert argv == (
        "--log-driver awslogs --log-opt awslogs-region=eu-west-1 --log-opt awslogs-group=/gpujobs/test/jobs"
        " --log-opt awslogs-stream=j-0123456789abcdef/2/1 --log-opt mode=non-blocking --log-opt max-buffer-size=16m"
    )
    runtime.start(doc, {})
    assert runtime.proc is not None
    runtime.wait()
    assert json.dumps(doc["image"]) in json.dumps(runtime.proc.args)
    assert all(option in runtime.proc.args for option in runtime.log_options)
