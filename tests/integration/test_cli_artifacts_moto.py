"""`gpujobs artifacts` and `gpujobs download` against moto: a user finds and fetches what a job left.

The job's outputs are objects under `outputs/<team>/<job-id>/` of the stack's bucket (the bootstrap's
uploads); their keys were chosen by the job, so the CLI treats them as hostile on the way to the
terminal and to the disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.contract import outputs_prefix
from gpujobs.domain.job import Job
from gpujobs.domain.spec import load_spec
from gpujobs_cli.main import main
from gpujobs_local.template import table_definition

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUCKET, TABLE, JOB = "gpujobs-checkpoints", "gpujobs-jobs", "j-00000000000000aa"
TEAM = "default"  # examples/digits.yaml names none
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


@dataclass
class Outputs:
    s3: Any
    store: DynamoJobStore

    def put(self, key: str, body: bytes, *, job_id: str = JOB, team: str | None = TEAM) -> None:
        self.s3.put_object(Bucket=BUCKET, Key=outputs_prefix(job_id, team=team) + key, Body=body)

    def add_job(self, job_id: str = JOB) -> None:
        spec = load_spec((EXAMPLES / "digits.yaml").read_bytes())
        self.store.create(Job.submitted(job_id=job_id, spec=spec, now=NOW, message_id=None))


@pytest.fixture
def outputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Outputs]:
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
    with mock_aws():
        s3, ddb = boto3.client("s3"), boto3.client("dynamodb")
        s3.create_bucket(Bucket=BUCKET)
        ddb.create_table(**table_definition(table_name=TABLE))
        yield Outputs(s3, DynamoJobStore(table_name=TABLE, client=ddb))


def a_finished_job(outputs: Outputs) -> None:
    outputs.add_job()
    outputs.put("model.safetensors", b"w" * 3000)
    outputs.put("metrics.json", b'{"loss": 0.1}')
    outputs.put("node-1/metrics.json", b'{"loss": 0.2}')


def test_artifacts_lists_every_nodes_files_with_size_and_time(
    outputs: Outputs, capsys: pytest.CaptureFixture[str]
) -> None:
    a_finished_job(outputs)

    code = main(["artifacts", JOB])

    out, err = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["KEY", "SIZE", "MODIFIED"]
    assert [line.split()[0] for line in lines[1:]] == ["metrics.json", "model.safetensors", "node-1/metrics.json"]
    assert "2.9 KiB" in lines[2]
    assert f"3 file(s), 3.0 KiB, in s3://{BUCKET}/outputs/{TEAM}/{JOB}/" in err


def test_artifacts_json_gives_keys_sizes_times_and_uris(outputs: Outputs, capsys: pytest.CaptureFixture[str]) -> None:
    a_finished_job(outputs)

    code = main(["artifacts", JOB, "--json"])

    listed = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(a["key"], a["size"]) for a in listed] == [
        ("metrics.json", 13),
        ("model.safetensors", 3000),
        ("node-1/metrics.json", 13),
    ]
    assert listed[1]["uri"] == f"s3://{BUCKET}/outputs/{TEAM}/{JOB}/model.safetensors"
    assert datetime.fromisoformat(listed[1]["modified"]).tzinfo is not None


def test_a_job_of_the_release_before_teams_in_names_is_downloaded_from_where_it_left_its_outputs(
    outputs: Outputs, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Given a job whose attempts the previous release ran: its outputs are under outputs/<job-id>/
    outputs.add_job()
    outputs.put("model.safetensors", b"old weights", team=None)

    # When its user lists and downloads them with this release
    assert main(["artifacts", JOB]) == 0
    listed = capsys.readouterr()
    assert main(["download", JOB]) == 0

    # Then they are found where that release put them
    assert listed.out.splitlines()[1].split()[0] == "model.safetensors"
    assert f"in s3://{BUCKET}/outputs/{JOB}/" in listed.err
    assert (tmp_path / JOB / "model.safetensors").read_bytes() == b"old weights"


def test_a_job_without_outputs_yet_is_told_apart_from_no_job(
    outputs: Outputs, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs.add_job()

    assert main(["artifacts", JOB]) == 0
    assert "has no outputs yet" in capsys.readouterr().err
    assert main(["artifacts", "j-00000000000000bb"]) == 3
    assert "no job j-00000000000000bb" in capsys.readouterr().err
    assert main(["download", JOB]) == 1


def test_download_fetches_every_file_into_the_jobs_folder_keeping_node_folders(
    outputs: Outputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_finished_job(outputs)

    code = main(["download", JOB])

    err = capsys.readouterr().err
    assert code == 0
    assert (tmp_path / JOB / "model.safetensors").read_bytes() == b"w" * 3000
    assert (tmp_path / JOB / "node-1" / "metrics.json").read_bytes() == b'{"loss": 0.2}'
    assert "[3/3] node-1/metrics.json" in err
    assert f"downloaded 3 file(s) to {JOB}" in err


def test_download_never_overwrites_unless_forced(outputs: Outputs, tmp_path: Path) -> None:
    a_finished_job(outputs)
    results = tmp_path / "results"
    results.mkdir()
    (results / "metrics.json").write_text("my own notes")

    assert main(["download", JOB, str(results)]) == 2
    assert (results / "metrics.json").read_text() == "my own notes"
    assert not (results / "model.safetensors").exists(), "nothing is written when anything would be overwritten"

    assert main(["download", JOB, str(results), "--force"]) == 0
    assert (results / "metrics.json").read_bytes() == b'{"loss": 0.1}'


def test_download_refuses_keys_that_lead_out_of_the_folder(
    outputs: Outputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs.add_job()
    outside = tmp_path / "outside"
    outside.mkdir()
    results = tmp_path / "results"
    results.mkdir()
    (results / "through-link").symlink_to(outside, target_is_directory=True)
    for key in ("../escaped.txt", "a/../../escaped.txt", "/etc/escaped.txt", "through-link/escaped.txt"):
        outputs.put(key, b"pwned")
    outputs.put("clear\x1b[2J.txt", b"pwned")
    outputs.put("fine/result.txt", b"ok")

    code = main(["download", JOB, str(results)])

    err = capsys.readouterr().err
    assert code == 1
    assert (results / "fine" / "result.txt").read_bytes() == b"ok"
    assert sorted(p.name for p in outside.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", "results"]
    written = sorted(str(p.relative_to(results)) for p in results.rglob("*"))
    assert written == ["fine", "fine/result.txt", "through-link"]
    assert err.count("skipping") == 5
    assert all(c == "\n" or c.isprintable() for c in err), repr(err)
    assert os.path.islink(results / "through-link")


def test_download_skips_keys_no_disk_can_hold_naming_each_and_fetches_the_rest(
    outputs: Outputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """S3 keys may be 1024 bytes with no limit per component and need no folders; a disk allows 255
    bytes per name and cannot hold `a` both as a file and as the folder of `a/b`."""
    outputs.add_job()
    long_name = "x" * 300
    outputs.put(f"{long_name}.txt", b"too long")
    outputs.put(f"deep/{long_name}/file.txt", b"too long a folder")
    outputs.put("a", b"a file")
    outputs.put("a/b", b"a file in the folder a")
    outputs.put("fine.txt", b"ok")
    results = tmp_path / "results"

    code = main(["download", JOB, str(results)])

    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    assert (results / "fine.txt").read_bytes() == b"ok"
    assert (results / "a" / "b").read_bytes() == b"a file in the folder a"
    assert sorted(str(p.relative_to(results)) for p in results.rglob("*")) == ["a", "a/b", "fine.txt"]
    skipped = [line for line in err.splitlines() if line.startswith("gpujobs: skipping ")]
    assert len(skipped) == 3, err
    assert any(f"'{long_name}.txt': a path component of 304 bytes" in line for line in skipped)
    assert any(f"'deep/{long_name}/file.txt': a path component of 300 bytes" in line for line in skipped)
    assert any(line.startswith("gpujobs: skipping 'a': it is also the folder of 'a/b'") for line in skipped)
    assert "downloaded 2 file(s)" in err
    assert "skipped 3 key(s)" in err


def test_download_skips_a_key_whose_folder_is_a_file_on_disk_and_fetches_the_rest(
    outputs: Outputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs.add_job()
    outputs.put("report/summary.txt", b"summary")
    outputs.put("fine.txt", b"ok")
    results = tmp_path / "results"
    results.mkdir()
    (results / "report").write_text("a file of mine where the job has a folder")

    code = main(["download", JOB, str(results)])

    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    assert (results / "fine.txt").read_bytes() == b"ok"
    assert (results / "report").read_text() == "a file of mine where the job has a folder"
    assert "gpujobs: skipping 'report/summary.txt': the disk refused it" in err


def test_download_shows_a_key_with_a_bidi_override_spelled_out(
    outputs: Outputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs.add_job()
    outputs.put("report\u202egnp.exe", b"x")
    outputs.put("fine.txt", b"ok")

    code = main(["download", JOB, str(tmp_path / "results")])

    err = capsys.readouterr().err
    assert code == 1
    assert "report\\u202egnp.exe" in err
    assert all(c == "\n" or c.isprintable() for c in err), repr(err)
