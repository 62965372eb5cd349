"""Checkpoints are trusted only if they are ours.

Whoever can write a job's checkpoint prefix (its own code, or until per-job credentials another
job) can plant a ``step-N/`` folder. The stories (2 ranks, gloo, torchrun) plant or alter steps in
a copy of the baseline's checkpoints and resume: code in a planted pickle never runs, a tampered
shard or a marker of another job is skipped for our previous commit (and the resume is still
bit-identical), and a job with no checkpoint of its own refuses to start rather than train from
scratch. The unit tests pin the rules behind them: the commit marker's file names, the safe
metadata and value loaders, and the exact-file-set check on disk and on S3.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import shutil
import struct
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from moto import mock_aws
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

from gpujobs_trainer import CONFIG_ERROR_EXIT_CODE
from gpujobs_trainer.digests import file_digest
from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.layout import CommitMarker, provenance_problems
from gpujobs_trainer.safe_load import SafeLoadPlanner, load_metadata
from gpujobs_trainer.storage import LocalStore, S3Store
from tests.iam.recorder import RECORDER
from tests.training.conftest import Baseline
from tests.training.harness import TOTAL_STEPS, assert_bit_identical, job_env, recommit, run_job

OURS = "job-test"  # the job id job_env gives every run


class _CreatesFile:
    """Unpickling this creates ``path``: a stand-in for any code an attacker wants to run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def _copy_of(baseline: Baseline, tmp_path: Path) -> Path:
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(baseline.checkpoint_dir, checkpoints)
    return checkpoints


def _plant(checkpoints: Path, *, step: int, like: int = TOTAL_STEPS) -> Path:
    """A new step folder holding a copy of step ``like`` (marker included)."""
    planted = checkpoints / f"step-{step:08d}"
    shutil.copytree(checkpoints / f"step-{like:08d}", planted)
    return planted


def _metadata_of(step_dir: Path) -> Metadata:
    with open(step_dir / ".metadata", "rb") as handle:  # our own file, in the test: trusted
        metadata: Metadata = pickle.load(handle)
    return metadata


def _resume(checkpoints: Path, tmp_path: Path, **env: str) -> tuple[Any, Path]:
    dump = tmp_path / "resumed.pt"
    result = run_job(job_env(str(checkpoints), **env), "--steps", str(TOTAL_STEPS), "--state-dump", str(dump))
    return result, dump


# ---- stories: a real job resumes next to planted or altered checkpoints ---------------------------
@pytest.mark.training
def test_a_planted_checkpoint_whose_metadata_would_run_code_is_never_executed(
    tmp_path: Path, baseline: Baseline
) -> None:
    checkpoints = _copy_of(baseline, tmp_path)
    planted = _plant(checkpoints, step=500)
    sentinel = tmp_path / "code-ran"
    (planted / ".metadata").write_bytes(pickle.dumps(_CreatesFile(sentinel)))
    recommit(planted, step=500)  # a marker that matches the planted files and names our job

    resumed, dump = _resume(checkpoints, tmp_path)

    assert not sentinel.exists(), "the planted pickle ran in the trainer"
    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == TOTAL_STEPS  # our newest commit, not the planted one
    assert "skipping checkpoint step 500" in resumed.output
    assert "io.open is not part of DCP's metadata" in resumed.output
    assert_bit_identical(baseline.state_dump, dump)


@pytest.mark.training
def test_a_planted_value_that_would_run_code_when_loaded_is_never_executed(tmp_path: Path, baseline: Baseline) -> None:
    """DCP stores non-tensor values (optimizer hyper-parameters, the LR schedule) as pickles in the
    shards. A forged step with sound metadata that points one of them at a pickle of its own
    passes every check on the files and is refused as it loads: nothing runs, and the job resumes
    from its own newest commit instead."""
    checkpoints = _copy_of(baseline, tmp_path)
    planted = _plant(checkpoints, step=500)
    metadata = _metadata_of(planted)
    index, info = next(
        (i, s)
        for i, s in metadata.storage_data.items()
        if isinstance(metadata.state_dict_metadata[i.fqn], BytesStorageMetadata)
    )
    sentinel = tmp_path / "code-ran"
    payload = io.BytesIO()
    torch.save(_CreatesFile(sentinel), payload)
    shard = planted / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as handle:
        handle.write(payload.getvalue())
    metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(payload.getvalue()))
    (planted / ".metadata").write_bytes(pickle.dumps(metadata))
    recommit(planted, step=500)

    resumed, dump = _resume(checkpoints, tmp_path)

    assert not sentinel.exists(), "the planted value ran code in the trainer"
    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == TOTAL_STEPS
    assert "skipping checkpoint step 500: it is committed but does not load" in resumed.output
    assert f"{index.fqn} holds more than plain values" in resumed.output
    assert resumed.events("resumed")[0]["skipped"][0].startswith("step 500: it is committed but does not load")
    assert_bit_identical(baseline.state_dump, dump)


@pytest.mark.training
def test_a_tampered_shard_is_detected_and_the_previous_commit_resumes_exactly(
    tmp_path: Path, baseline: Baseline
) -> None:
    """The change keeps the shard loadable (one weight in a tensor's data, CRC32 and sizes as they
    were), so nothing but the digest can tell."""
    checkpoints = _copy_of(baseline, tmp_path)
    newest = checkpoints / f"step-{TOTAL_STEPS:08d}"
    metadata = _metadata_of(newest)
    info = next(
        s
        for i, s in metadata.storage_data.items()
        if i.fqn.startswith("app.model.") and isinstance(metadata.state_dict_metadata[i.fqn], TensorStorageMetadata)
    )
    _nudge_first_value(newest / info.relative_path, info)

    resumed, dump = _resume(checkpoints, tmp_path)

    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == 300
    assert f"{info.relative_path} does not match its blake3 digest" in resumed.output
    assert_bit_identical(baseline.state_dump, dump)


def _nudge_first_value(shard: Path, info: _StorageInfo) -> None:
    """Change the first float of the tensor record at ``info`` in place (a torch.save archive)."""
    data = bytearray(shard.read_bytes())
    record = bytes(data[info.offset : info.offset + info.length])
    entry = next(e for e in zipfile.ZipFile(io.BytesIO(record)).infolist() if e.filename.endswith("/data/0"))
    name_length, extra_length = struct.unpack("<HH", record[entry.header_offset + 26 : entry.header_offset + 30])
    start = info.offset + entry.header_offset + 30 + name_length + extra_length
    (value,) = struct.unpack("<f", data[start : start + 4])
    data[start : start + 4] = struct.pack("<f", value + 1.0)
    shard.write_bytes(bytes(data))


@pytest.mark.training
def test_a_checkpoint_committed_by_another_job_is_refused(tmp_path: Path, baseline: Baseline) -> None:
    checkpoints = _copy_of(baseline, tmp_path)
    recommit(_plant(checkpoints, step=500), step=500, job_id="job-of-another-team")

    resumed, dump = _resume(checkpoints, tmp_path)

    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == TOTAL_STEPS
    assert "its commit marker belongs to job 'job-of-another-team', not 'job-test'" in resumed.output
    assert_bit_identical(baseline.state_dump, dump)


@pytest.mark.training
def test_a_job_whose_only_checkpoints_are_another_jobs_stops_instead_of_training_from_scratch(
    tmp_path: Path, baseline: Baseline
) -> None:
    checkpoints = _copy_of(baseline, tmp_path)

    resumed, _ = _resume(checkpoints, tmp_path, GPUJOBS_JOB_ID="job-newcomer")

    assert resumed.exit_code == CONFIG_ERROR_EXIT_CODE, resumed.output
    assert "committed steps all skipped: step 400: " in resumed.output
    assert "; step 300: " in resumed.output
    assert "belongs to job 'job-test', not 'job-newcomer'" in resumed.output
    assert not any("[digits] step" in line for line in resumed.lines)


# ---- the rules behind them -------------------------------------------------------------------------
def _marker_json(*names: str, job_id: str = OURS) -> str:
    return json.dumps(
        {
            "step": 7,
            "world_size": 1,
            "torch_version": torch.__version__,
            "reason": "periodic",
            "files": [{"name": n, "size": 1, "sha256": "0" * 64} for n in names],
            "time": "2030-01-01T00:00:00+00:00",
            "job_id": job_id,
            "attempt": 3,
        }
    )


@pytest.mark.parametrize(
    "name",
    ["../step-00000001/__0_0.distcp", "/etc/passwd", "sub/__0_0.distcp", "..", "__0_0.distcp/../x", "model.pt", ""],
)
def test_a_marker_listing_anything_but_dcp_and_rng_file_names_is_malformed(name: str) -> None:
    with pytest.raises(CheckpointError, match="lists files a checkpoint never holds"):
        CommitMarker.from_json(_marker_json(".metadata", name))


def test_a_marker_vouches_only_for_its_own_job_step_and_digested_files() -> None:
    marker = CommitMarker.from_json(_marker_json(".metadata", "__0_0.distcp", "rng-rank-00000.json"))
    assert marker.attempt == 3
    assert provenance_problems(marker, step=7, job_id=OURS) == []
    assert provenance_problems(marker, step=8, job_id="job-b") == [
        f"its commit marker belongs to job {OURS!r}, not 'job-b'",
        "its commit marker is for step 7",
    ]
    undigested = dataclasses.replace(marker, digests={})
    assert provenance_problems(undigested, step=7, job_id=OURS) == [
        "its commit marker records no digest for .metadata, __0_0.distcp, rng-rank-00000.json"
    ]


@pytest.fixture(scope="module")
def real_metadata(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DCP metadata of a small model, optimizer and LR scheduler, saved by torch itself."""
    import torch.distributed.checkpoint as dcp

    from gpujobs_trainer.state_io import TrainingState

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=5)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    folder = tmp_path_factory.mktemp("dcp")
    with warnings.catch_warnings():  # "torch.distributed is disabled ...: a single process"
        warnings.simplefilter("ignore")
        dcp.save({"app": TrainingState(model, optimizer, scheduler)}, checkpoint_id=str(folder), no_dist=True)
    return folder / ".metadata"


def test_real_dcp_metadata_loads_with_the_allowlist(real_metadata: Path) -> None:
    metadata = load_metadata(real_metadata, shard_files={"__0_0.distcp"})
    assert isinstance(metadata, Metadata)
    assert {info.relative_path for info in metadata.storage_data.values()} == {"__0_0.distcp"}
    assert "app.optim.state.0.weight.exp_avg" in metadata.state_dict_metadata


def test_metadata_that_would_run_code_is_refused_before_anything_runs(tmp_path: Path) -> None:
    sentinel = tmp_path / "code-ran"
    planted = tmp_path / ".metadata"
    planted.write_bytes(pickle.dumps(_CreatesFile(sentinel)))
    with pytest.raises(CheckpointError, match=r"io\.open is not part of DCP's metadata"):
        load_metadata(planted)
    assert not sentinel.exists()


def test_metadata_cannot_change_the_classes_it_is_allowed_to_use(tmp_path: Path) -> None:
    """A BUILD applied to a class (not an instance) would set attributes on it for the whole
    process, e.g. a default ``relative_path`` for every storage entry: refused."""
    cls = _StorageInfo
    crafted = (
        b"\x80\x04"
        + b"c" + cls.__module__.encode() + b"\n" + cls.__name__.encode() + b"\n"  # GLOBAL
        + b"N}\x8c\x0bcheckpoint_\x8c\x0b/etc/passwd" + b"s\x86"  # state = (None, {attr: value})
        + b"b."  # BUILD, STOP
    )  # fmt: skip
    planted = tmp_path / ".metadata"
    planted.write_bytes(crafted)
    with pytest.raises(CheckpointError, match="refusing to set the state of type"):
        load_metadata(planted)
    assert not hasattr(cls, "checkpoint_")


@pytest.mark.parametrize("path", ["../../secrets/__0_0.distcp", "/etc/passwd", "sub/__0_0.distcp", "__9_0.distcp"])
def test_metadata_pointing_outside_the_listed_shards_is_refused(real_metadata: Path, tmp_path: Path, path: str) -> None:
    metadata = load_metadata(real_metadata)
    first = next(iter(metadata.storage_data))
    metadata.storage_data[first] = dataclasses.replace(metadata.storage_data[first], relative_path=path)
    forged = tmp_path / ".metadata"
    forged.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match=f"{first.fqn!r} points at"):
        load_metadata(forged, shard_files={"__0_0.distcp"})


def test_metadata_asking_for_stream_transforms_is_refused(real_metadata: Path, tmp_path: Path) -> None:
    metadata = load_metadata(real_metadata)
    first = next(iter(metadata.storage_data))
    metadata.storage_data[first] = dataclasses.replace(
        metadata.storage_data[first], transform_descriptors=["zstandard"]
    )
    forged = tmp_path / ".metadata"
    forged.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match="asks for stream transforms"):
        load_metadata(forged)


def test_values_in_shards_load_only_as_plain_data(tmp_path: Path) -> None:
    state: dict[str, Any] = {"lr": None}
    planner = SafeLoadPlanner(flatten_state_dict=False)
    planner.state_dict = state
    item = ReadItem(
        type=LoadItemType.BYTE_IO,
        dest_index=MetadataIndex("lr"),
        dest_offsets=torch.Size([0]),
        storage_index=MetadataIndex("lr"),
        storage_offsets=torch.Size([0]),
        lengths=torch.Size([0]),
    )
    plain = io.BytesIO()
    torch.save({"lr": 0.1, "betas": (0.9, 0.999), "params": ["w"]}, plain)
    plain.seek(0)
    planner.load_bytes(item, plain)
    assert state["lr"] == {"lr": 0.1, "betas": (0.9, 0.999), "params": ["w"]}

    sentinel = tmp_path / "code-ran"
    hostile = io.BytesIO()
    torch.save(_CreatesFile(sentinel), hostile)
    hostile.seek(0)
    with pytest.raises(CheckpointError, match="lr holds more than plain values"):
        planner.load_bytes(item, hostile)
    assert not sentinel.exists()


def _write_step(folder: Path) -> CommitMarker:
    folder.mkdir(parents=True)
    files = {".metadata": b"meta", "__0_0.distcp": b"shard-bytes", "rng-rank-00000.json": b"{}"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return CommitMarker(
        step=7,
        world_size=1,
        torch_version=torch.__version__,
        reason="periodic",
        files={name: len(data) for name, data in files.items()},
        digests={name: file_digest(folder / name) for name in files},
        time="2030-01-01T00:00:00+00:00",
        job_id=OURS,
    )


def test_a_local_step_must_hold_exactly_the_listed_files_with_their_digests(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    marker = _write_step(store.staging_dir(7))
    store.write_commit(marker)
    assert store.fetch(7, store.read_commit(7)) == store.staging_dir(7)

    (store.staging_dir(7) / "__1_0.distcp").write_bytes(b"planted")
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp is not listed in its commit marker"):
        store.fetch(7, marker)
    (store.staging_dir(7) / "__1_0.distcp").unlink()

    (store.staging_dir(7) / "__0_0.distcp").write_bytes(b"shard-BYTES")  # same size, other bytes
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp does not match its blake3 digest"):
        store.fetch(7, marker)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="ckpt")
        yield client


def test_an_s3_step_with_an_object_its_marker_does_not_list_is_refused(s3: Any, tmp_path: Path) -> None:
    marker = _write_step(tmp_path / "written" / "step-00000007")
    for name in marker.files:
        s3.upload_file(str(tmp_path / "written" / "step-00000007" / name), "ckpt", f"jobs/j/step-00000007/{name}")
    store = S3Store(uri="s3://ckpt/jobs/j", bucket="ckpt", prefix="jobs/j", local_dir=str(tmp_path / "staging"))
    # the store with a client of the test's own, no job session: its calls are no stack principal's
    # (the trainer's under the job role's session tags are judged in the e2e and S3 stories)
    with RECORDER.unattributed("S3Store with the test's own client, outside any job session"):
        fetched = store.fetch(7, marker)
        assert sorted(p.name for p in fetched.iterdir()) == sorted(marker.files)

        s3.put_object(Bucket="ckpt", Key="jobs/j/step-00000007/nested/__0_0.distcp", Body=b"planted")
        with pytest.raises(CheckpointError, match=r"nested/__0_0\.distcp is not listed in its commit marker"):
            store.fetch(7, marker)
