"""`gpujobs submit` ships a local `code:` folder: packed, uploaded under the job's prefix, named in the message.

Against moto: the queue, and the stack's bucket named by GPUJOBS_BUCKET. What the launcher unpacks
(`gpujobs_trainer.code_archive`) is checked against the folder the user packed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.domain.job_access import session_policy
from gpujobs.domain.job_ids import job_id_for
from gpujobs_cli.main import main
from gpujobs_trainer.code_archive import unpack

pytestmark = pytest.mark.integration

BUCKET = "gpujobs-checkpoints"
SPEC = {
    "name": "shipped",
    "image": "example.com/team/train:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge"],
    "checkpoint": "directory",
    "code": "./src",
    "client_token": "ship-1",
}


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("PATH", "")  # no docker: the entrypoint check stays silent
    with mock_aws():
        sqs = boto3.client("sqs")
        url = sqs.create_queue(QueueName="gpujobs-jobs")["QueueUrl"]
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        monkeypatch.setenv("GPUJOBS_QUEUE_URL", url)
        monkeypatch.setenv("GPUJOBS_BUCKET", BUCKET)
        yield sqs, url


def _project(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('training')\n")
    (src / "pkg" / "model.py").write_text("LAYERS = 2\n")
    (src / "data.bin").write_bytes(b"\0" * 1024)
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"cache")
    (src / ".gpujobsignore").write_text("# large local files\n*.bin\n")
    (tmp_path / "job.yaml").write_text(json.dumps(SPEC))
    return src


def _sent(queue: tuple[Any, str]) -> list[dict[str, Any]]:
    sqs, url = queue
    return [
        json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    ]


def test_a_local_code_folder_is_packed_uploaded_and_named_in_the_message(
    queue: tuple[Any, str], tmp_path: Path
) -> None:
    # given a project folder next to its spec
    _project(tmp_path)

    # when it is submitted
    assert main(["submit", str(tmp_path / "job.yaml")]) == 0

    # then the message names an archive under the job's own prefix, with its digest
    (message,) = _sent(queue)
    job_id = job_id_for(client_token="ship-1", team="default", message_id=None)
    assert message["code"] == f"s3://{BUCKET}/jobs/{job_id}/code/{message['code_sha256']}.tar.gz"
    body = boto3.client("s3").get_object(Bucket=BUCKET, Key=message["code"].split("/", 3)[3])["Body"].read()
    assert hashlib.sha256(body).hexdigest() == message["code_sha256"]
    # and the launcher unpacks exactly the project's code (ignored and cached files left out)
    (tmp_path / "archive.tar.gz").write_bytes(body)
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    unpack(tmp_path / "archive.tar.gz", workdir)
    assert sorted(p.relative_to(workdir).as_posix() for p in workdir.rglob("*") if p.is_file()) == [
        "pkg/model.py",
        "train.py",
    ]
    # and the job's own session may read it
    (own_prefix,) = [s for s in session_policy(bucket=BUCKET, job_id=job_id, team="default")["Statement"]
                     if s["Sid"] == "OwnJobPrefix"]  # fmt: skip
    assert "s3:GetObject" in own_prefix["Action"]
    assert fnmatch.fnmatch(f"arn:aws:s3:::{BUCKET}/{message['code'].split('/', 3)[3]}", own_prefix["Resource"])


def test_the_same_folder_packs_to_the_same_archive_so_a_resubmission_stays_idempotent(
    queue: tuple[Any, str], tmp_path: Path
) -> None:
    src = _project(tmp_path)
    assert main(["submit", str(tmp_path / "job.yaml")]) == 0
    (src / "train.py").touch()  # a new mtime, same contents
    assert main(["submit", str(tmp_path / "job.yaml")]) == 0

    first, second = _sent(queue)
    assert first == second


def test_a_link_out_of_the_code_folder_is_refused_and_nothing_is_sent(
    queue: tuple[Any, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _project(tmp_path)
    (tmp_path / "credentials").write_text("secret")
    (src / "creds").symlink_to(tmp_path / "credentials")

    assert main(["submit", str(tmp_path / "job.yaml")]) == 1

    assert "creds links out of the code folder" in capsys.readouterr().err
    assert _sent(queue) == []
    assert boto3.client("s3").list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0
