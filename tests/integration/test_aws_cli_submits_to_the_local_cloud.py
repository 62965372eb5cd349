"""The README's `aws sqs send-message` line submits a job to the local cloud, with AWS CLI v1 and v2.

AWS CLI v1 (the `awscli` package, pinned in the dev extra) is run as the real program. For SQS it
sets its own legacy endpoint (`https://queue.amazonaws.com` in us-east-1) whenever the command line
names none, so `AWS_ENDPOINT_URL` alone does not reach the local cloud: the README's line passes
`--endpoint-url`, and the first test runs that very line from README.md through bash.

AWS CLI v2 is not on PyPI. It honours `AWS_ENDPOINT_URL` (and `--endpoint-url`) through the same
configured-endpoint resolution botocore has, so its behaviour is emulated here with a botocore client
created without an endpoint, in an environment that holds only what `gpujobs local up` exports.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Job
from gpujobs.domain.job_ids import job_id_for
from gpujobs.service.ports import JobNotFoundError
from gpujobs_local.cli import SEND_MESSAGE
from gpujobs_local.cloud import LocalCloud

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
AWS_CLI_V1 = Path(sys.executable).parent / "aws"


def readme_send_message_line() -> str:
    """The `aws sqs send-message ...` command README.md tells a user to run against the local cloud."""
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()]
    found = [line for line in lines if line.startswith("aws sqs send-message")]
    assert found == [SEND_MESSAGE], "README.md shows the line `gpujobs local up` prints, once"
    return found[0]


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[LocalCloud]:
    local = LocalCloud(workdir=tmp_path / "cloud", reconcile_every=3600, retry_delay=0, poll_interval=0.05)
    local.start()
    try:
        yield local
    finally:
        local.stop()


def user_shell_env(cloud: LocalCloud, home: Path) -> dict[str, str]:
    """Another shell after `source env.sh`: the exports and nothing of this test's AWS settings."""
    home.mkdir(exist_ok=True)
    kept = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")}
    return {**kept, **cloud.exports(), "HOME": str(home)}


def submitted_job(cloud: LocalCloud, message_id: str) -> Job:
    """The job the submit function recorded for the message (a spec without client_token is keyed by it)."""
    store = DynamoJobStore(table_name=cloud.outputs["JobsTableName"], client=cloud.client("dynamodb"))
    job_id = job_id_for(client_token=None, team=None, message_id=message_id)
    found: list[Job] = []

    def recorded() -> bool:
        try:
            found.append(store.get(job_id))
        except JobNotFoundError:
            return False
        return True

    cloud.wait_until(recorded, timeout=30, what=f"job {job_id} to be recorded")
    return found[-1]


def test_the_readme_line_submits_a_job_with_aws_cli_v1(cloud: LocalCloud, tmp_path: Path) -> None:
    # given a shell with what `gpujobs local up` exports, and AWS CLI v1 on its PATH
    assert AWS_CLI_V1.exists(), "the dev extra pins awscli (AWS CLI v1): run `make setup`"
    env = user_shell_env(cloud, tmp_path / "home")
    env["PATH"] = f"{AWS_CLI_V1.parent}{os.pathsep}{env.get('PATH', '')}"

    # when the user runs the README's line, from the repository root
    done = subprocess.run(
        ["bash", "-c", readme_send_message_line()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    # then the message reached the local cloud's queue, and the example became a job
    assert done.returncode == 0, done.stderr[-2000:]
    job = submitted_job(cloud, json.loads(done.stdout)["MessageId"])
    assert job.spec.name == "cpu-smoke"


def test_aws_cli_v1_without_endpoint_url_goes_to_its_legacy_sqs_endpoint(cloud: LocalCloud, tmp_path: Path) -> None:
    # given the same shell, and a command line that names no endpoint
    env = {**user_shell_env(cloud, tmp_path / "home"), "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}
    argv = [str(AWS_CLI_V1), "sqs", "send-message", "--queue-url", env["GPUJOBS_QUEUE_URL"], "--message-body", "{}"]

    done = subprocess.run(
        [*argv, "--cli-connect-timeout", "2", "--debug"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    # then v1 ignored AWS_ENDPOINT_URL for SQS: this is why the README's line passes --endpoint-url
    assert done.returncode != 0
    assert re.search(r"url=https://queue\.amazonaws\.com/", done.stderr), done.stderr[-2000:]


def test_aws_cli_v2_behaviour_reaches_the_local_cloud_through_aws_endpoint_url(
    cloud: LocalCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given only what `gpujobs local up` exports (emulating v2: botocore's configured-endpoint resolution)
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in user_shell_env(cloud, tmp_path / "home").items():
        monkeypatch.setenv(name, value)
    sqs = boto3.session.Session().client("sqs")  # no endpoint_url: resolved from AWS_ENDPOINT_URL
    assert sqs.meta.endpoint_url == cloud.endpoint_url

    # when the example is sent as the README's line sends it
    body = (ROOT / "examples" / "cpu-smoke.json").read_text()
    sent = sqs.send_message(QueueUrl=os.environ["GPUJOBS_QUEUE_URL"], MessageBody=body)

    # then it became a job on the local cloud
    assert submitted_job(cloud, sent["MessageId"]).spec.name == "cpu-smoke"
