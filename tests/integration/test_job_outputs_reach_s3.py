"""What a job writes to $GPUJOBS_OUTPUT_DIR reaches `s3://<bucket>/outputs/<team>/<job-id>/`, and nothing else does.

Stories: the bootstrap gives the workload an output folder and uploads it when the workload ends,
whatever its exit, and on request while it runs; each node has its place under the job's prefix;
asking twice sends nothing twice; a link out of the folder is never followed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.contract import OUTPUT_UNSENT_PREFIX, OUTPUT_UPLOAD_REQUEST_FILE
from gpujobs.domain.job_access import outputs_uri
from gpujobs.domain.rundoc import RunDocument
from gpujobs.instance import bootstrap, rundoc, runtimes
from gpujobs.instance.contract import WORKLOAD_UID
from gpujobs.instance.outputs import Outputs
from gpujobs.instance.userdata import render_user_data
from gpujobs_trainer.outputs import upload_and_wait
from tests.unit.fake_imds import FakeImds

pytestmark = pytest.mark.integration

BUCKET = "stack-checkpoints"
URI = outputs_uri(bucket=BUCKET, job_id="j-7", team="vision")


def keys(s3: Any, prefix: str = "outputs/") -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


@pytest.fixture
def s3(aws_credentials: None) -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def outputs_in(folder: Path, s3: Any, *, node_rank: int = 0, poll: float = 5.0) -> Outputs:
    folder.mkdir(exist_ok=True)
    return Outputs(str(folder), lambda _service: s3, uri=URI, node_rank=node_rank, poll=poll)


# ---- the upload ---------------------------------------------------------------------------------
def test_node_0_uploads_to_the_jobs_prefix_and_other_nodes_under_their_own_folder(tmp_path: Path, s3: Any) -> None:
    for node in (0, 2):
        folder = tmp_path / f"node{node}"
        (folder / "eval").mkdir(parents=True)
        (folder / "metrics.json").write_text(f'{{"node": {node}}}')
        (folder / "eval" / "samples.txt").write_text("a cat")
        outputs_in(folder, s3, node_rank=node).upload()

    assert keys(s3) == {
        "outputs/vision/j-7/metrics.json": b'{"node": 0}',
        "outputs/vision/j-7/eval/samples.txt": b"a cat",
        "outputs/vision/j-7/node-2/metrics.json": b'{"node": 2}',
        "outputs/vision/j-7/node-2/eval/samples.txt": b"a cat",
    }


def test_asking_twice_sends_only_what_changed_in_between(tmp_path: Path, s3: Any) -> None:
    outputs = outputs_in(tmp_path / "out", s3)
    (tmp_path / "out" / "a.txt").write_text("one")
    (tmp_path / "out" / "b.txt").write_text("two")

    assert outputs.upload() == 2
    assert outputs.upload() == 0
    (tmp_path / "out" / "b.txt").write_text("three")
    assert outputs.upload() == 1
    assert keys(s3)["outputs/vision/j-7/b.txt"] == b"three"


def test_nothing_outside_the_folder_is_uploaded_through_a_link(tmp_path: Path, s3: Any) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("root's")
    secrets = tmp_path / "host-folder"
    secrets.mkdir()
    (secrets / "key").write_text("root's too")
    outputs = outputs_in(tmp_path / "out", s3)
    out = tmp_path / "out"
    (out / "model.bin").write_bytes(b"\x00weights")
    (out / "link-to-secret").symlink_to(secret)
    (out / "link-to-folder").symlink_to(secrets, target_is_directory=True)
    os.link(secret, out / "hard-link-to-secret")
    os.mkfifo(out / "a-fifo")
    (out / OUTPUT_UPLOAD_REQUEST_FILE).touch()

    outputs.upload()

    assert keys(s3) == {"outputs/vision/j-7/model.bin": b"\x00weights"}


def test_files_still_being_written_and_the_request_itself_are_never_uploaded(tmp_path: Path, s3: Any) -> None:
    outputs = outputs_in(tmp_path / "out", s3)
    (tmp_path / "out" / "sub").mkdir()
    (tmp_path / "out" / f"{OUTPUT_UNSENT_PREFIX}model.safetensors").write_bytes(b"half of it")
    (tmp_path / "out" / "sub" / f"{OUTPUT_UNSENT_PREFIX}log.txt").write_text("half")
    (tmp_path / "out" / OUTPUT_UPLOAD_REQUEST_FILE).touch()
    (tmp_path / "out" / "done.txt").write_text("whole")

    outputs.upload()

    assert keys(s3) == {"outputs/vision/j-7/done.txt": b"whole"}


def test_a_request_uploads_while_the_job_runs_and_the_end_uploads_the_rest(tmp_path: Path, s3: Any) -> None:
    with outputs_in(tmp_path / "out", s3, poll=0.05):
        (tmp_path / "out" / "epoch-1.txt").write_text("loss 0.5")
        (tmp_path / "out" / OUTPUT_UPLOAD_REQUEST_FILE).touch()
        deadline = time.monotonic() + 10
        while "outputs/vision/j-7/epoch-1.txt" not in keys(s3) and time.monotonic() < deadline:
            time.sleep(0.05)

        assert keys(s3) == {"outputs/vision/j-7/epoch-1.txt": b"loss 0.5"}
        (tmp_path / "out" / "epoch-2.txt").write_text("loss 0.4")

    assert set(keys(s3)) == {"outputs/vision/j-7/epoch-1.txt", "outputs/vision/j-7/epoch-2.txt"}


def test_a_workload_that_waits_for_its_request_finds_everything_it_wrote_in_s3(tmp_path: Path, s3: Any) -> None:
    folder = tmp_path / "out"
    with outputs_in(folder, s3, poll=0.05):
        (folder / "model.safetensors").write_bytes(b"weights")

        assert upload_and_wait(folder, timeout=10, poll=0.01)
        assert keys(s3) == {"outputs/vision/j-7/model.safetensors": b"weights"}
        assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]


def test_waiting_where_no_bootstrap_serves_the_folder_gives_up_after_the_timeout(tmp_path: Path) -> None:
    assert not upload_and_wait(tmp_path, timeout=0.1, poll=0.01)


def test_an_upload_that_fails_is_logged_and_never_raises(tmp_path: Path, s3: Any, capsys: Any) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    with Outputs(str(folder), lambda _service: s3, uri="s3://no-such-bucket/outputs/vision/j-7/", node_rank=0):
        pass

    assert "upload to s3://no-such-bucket/outputs/vision/j-7/ failed" in capsys.readouterr().out


def test_docker_mounts_a_fresh_folder_owned_by_the_images_user_where_the_workload_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = tmp_path / "docker"
    docker.write_text(
        f"#!{sys.executable}\nimport sys\nopen({str(tmp_path / 'argv')!r}, 'w').write(chr(0).join(sys.argv[1:]))\n"
    )
    docker.chmod(0o755)
    monkeypatch.setattr(runtimes, "HOST_DATA_DIR", str(tmp_path / "var-lib-gpujobs"))
    owners: list[tuple[str, int, int]] = []
    monkeypatch.setattr(runtimes.os, "chown", lambda path, uid, gid: owners.append((path, uid, gid)))
    doc = rundoc.check_document(
        {
            "job_id": "j-7",
            "attempt": 1,
            "name": "n",
            "image": "img:1",
            "command": ["train"],
            "checkpoint_uri": "s3://b/k",
        }
    )
    runtime = runtimes.DockerRuntime(str(docker))

    folder, seen_as = runtime.outputs_folder()
    runtime.start(doc, {})
    assert runtime.wait() == 0

    argv = (tmp_path / "argv").read_text().split("\0")
    assert Path(folder).is_dir()
    assert Path(folder).parent == tmp_path / "var-lib-gpujobs"
    assert owners == [(folder, WORKLOAD_UID, WORKLOAD_UID)]
    assert seen_as == runtimes.OUTPUTS_IN_CONTAINER
    mount = argv.index("--mount")
    assert argv[mount + 1] == f"type=bind,src={folder},dst={seen_as}"
    assert mount < argv.index("img:1")


# ---- through the bootstrap ------------------------------------------------------------------------
WORKLOAD = textwrap.dedent(
    """
    import os, pathlib, sys, time
    import boto3
    out = pathlib.Path(os.environ["GPUJOBS_OUTPUT_DIR"])
    (out / "early.txt").write_text("during the job")
    (out / "{request}").touch()
    s3 = boto3.client("s3")
    deadline = time.monotonic() + 30
    while not s3.list_objects_v2(Bucket="{bucket}", Prefix="outputs/vision/j-7/early.txt").get("KeyCount"):
        assert time.monotonic() < deadline, "the requested upload never happened"
        time.sleep(0.2)
    (out / "last-words.txt").write_text("crashing now")
    sys.exit(3)
    """
).format(request=OUTPUT_UPLOAD_REQUEST_FILE, bucket=BUCKET)


@pytest.mark.slow
def test_the_bootstrap_uploads_on_request_and_when_the_workload_fails(tmp_path: Path, moto_endpoint: str) -> None:
    aws = {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    s3 = boto3.client("s3", **{"endpoint_url": moto_endpoint, "region_name": "us-east-1"} | _keys(aws))
    s3.create_bucket(Bucket=BUCKET)
    doc = RunDocument(
        job_id="j-7",
        attempt=1,
        name="crashes-after-writing",
        image="unused-by-process-runtime",
        command=[sys.executable, "-c", WORKLOAD],
        gpus_per_node=0,
        checkpoint_uri=f"s3://{BUCKET}/jobs/j-7/ckpt",
        region="us-east-1",
        outputs_uri=URI,
    )
    with FakeImds(user_data=render_user_data(doc, bucket=BUCKET, region="us-east-1")) as imds:
        env = {**aws, "PATH": os.environ["PATH"], "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint}
        done = subprocess.run(
            [sys.executable, bootstrap.__file__, "--runtime", "process", "--no-shutdown"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    assert done.returncode == 3, done.stdout + done.stderr
    assert keys(s3) == {
        "outputs/vision/j-7/early.txt": b"during the job",
        "outputs/vision/j-7/last-words.txt": b"crashing now",
    }
    assert "outputs (request): 1 file(s) uploaded" in done.stdout
    assert "outputs (the end): 1 file(s) uploaded" in done.stdout


def _keys(env: dict[str, str]) -> dict[str, str]:
    return {"aws_access_key_id": env["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"]}
