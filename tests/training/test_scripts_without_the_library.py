"""Scripts that do not use gpujobs_trainer: their own checkpoint folder synced and restored, no SIGUSR1.

The folder's copy is exercised on a local path (the same code writes S3 through boto3 on an
instance); the launcher runs real 2-process torchrun jobs of `own_snapshots_train.py`, a script
that knows nothing of gpujobs.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from gpujobs_trainer import CRASH_EXIT_CODE, PREEMPTED_EXIT_CODE, SUCCESS_EXIT_CODE
from gpujobs_trainer.code_archive import CodeArchiveError, fetch, unpack
from gpujobs_trainer.directory_sync import DirectorySync, Entry, LocalObjects, Manifest
from gpujobs_trainer.errors import SYNC_FAILED_EXIT_CODE, CheckpointError
from gpujobs_trainer.script_checkpoints import script_exit
from gpujobs_trainer.sync_manifest import MANIFESTS
from gpujobs_trainer.workers import catches
from tests.training.harness import PYTHON, job_env

SCRIPT = Path(__file__).with_name("own_snapshots_train.py")


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- the folder's copy ---------------------------------------------------------------------------
def newest_manifest(copy: Path) -> dict[str, Any]:
    """The newest manifest a sync wrote under ``copy`` (the folder's copy in the store)."""
    data: dict[str, Any] = json.loads(max((copy / MANIFESTS).glob("*.json")).read_text())
    return data


def test_a_synced_folder_is_restored_file_for_file(tmp_path: Path) -> None:
    # given a script's folder with nested files, synced
    folder, store = tmp_path / "run", LocalObjects(tmp_path / "copy")
    (folder / "opt").mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"weights-1")
    (folder / "opt" / "state.pt").write_bytes(b"optimizer")
    assert DirectorySync(folder, store).sync_once(settled=True)

    # when a fresh attempt restores it
    restored = tmp_path / "replacement"
    assert DirectorySync(restored, store, attempt=1).restore() == 2

    # then it holds the same files
    assert files_under(restored) == files_under(folder)


def test_only_changed_files_are_uploaded_and_blobs_no_kept_manifest_lists_are_deleted(tmp_path: Path) -> None:
    folder, copy = tmp_path / "run", tmp_path / "copy"
    folder.mkdir()
    (folder / "b.pt").write_bytes(b"unchanged")
    sync = DirectorySync(folder, LocalObjects(copy), keep=2)
    for body in (b"one", b"two", b"three"):
        (folder / "a.pt").write_bytes(body)
        assert sync.sync_once(settled=True)
        assert not sync.sync_once(settled=True)  # nothing changed: no new manifest

    manifests = sorted((copy / MANIFESTS).glob("*.json"))
    listed = {e["digest"] for m in manifests for e in json.loads(m.read_text())["files"].values()}
    assert [m.name for m in manifests] == ["000000-00000002.json", "000000-00000003.json"]
    assert sorted(p.name for p in (copy / "blobs").iterdir()) == sorted(listed)  # "one" is gone
    assert len(listed) == 3


def test_blobs_another_node_may_be_restoring_stay_until_the_last_sync(tmp_path: Path) -> None:
    # given a folder a previous attempt synced, restored by this attempt (and, maybe, its other nodes)
    copy = tmp_path / "copy"
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "snapshot.pt").write_bytes(b"step-10")
    DirectorySync(earlier, LocalObjects(copy), attempt=1).sync_once(settled=True)
    folder = tmp_path / "run"
    sync = DirectorySync(folder, LocalObjects(copy), attempt=2, keep=2)
    sync.restore()
    (restored_blob,) = (copy / "blobs").iterdir()

    # when the script replaces its snapshot three times while it runs
    for body in (b"step-20", b"step-30", b"step-40"):
        (folder / "snapshot.pt").write_bytes(body)
        sync.sync_once(settled=True)

    # then the restored blob is kept while the attempt runs, and goes once it ended
    assert restored_blob.exists()
    sync.finish()
    assert not restored_blob.exists()
    assert newest_manifest(copy)["files"]["snapshot.pt"]["digest"] in {p.name for p in (copy / "blobs").iterdir()}


class _CutShort(LocalObjects):
    """The instance goes away after the blobs are uploaded, before the manifest is written."""

    def write(self, key: str, data: bytes) -> None:
        raise ConnectionError("instance terminated")


def test_a_sync_cut_short_leaves_the_previous_complete_folder_to_restore(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "snapshot.pt").write_bytes(b"step-10")
    sync = DirectorySync(folder, LocalObjects(tmp_path / "copy"))
    sync.sync_once(settled=True)

    (folder / "snapshot.pt").write_bytes(b"step-20 half")
    (folder / "extra.pt").write_bytes(b"new")
    sync.objects = _CutShort(tmp_path / "copy")
    with pytest.raises(ConnectionError):
        sync.sync_once(settled=True)

    restored = tmp_path / "replacement"
    DirectorySync(restored, LocalObjects(tmp_path / "copy"), attempt=1).restore()
    assert files_under(restored) == {"snapshot.pt": b"step-10"}


def test_a_manifest_naming_a_path_outside_the_folder_is_refused(tmp_path: Path) -> None:
    store = LocalObjects(tmp_path / "copy")
    planted = Manifest(job_id="local", attempt=0, sequence=1, time="t", files={"../x": Entry("0" * 64, 1)})
    store.write(f"{MANIFESTS}/{planted.name}", planted.to_bytes(b""))
    with pytest.raises(CheckpointError, match="not a path inside the folder"):
        DirectorySync(tmp_path / "run", store).restore()
    assert not (tmp_path / "x").exists()


def test_symlinks_are_not_followed_into_the_copy(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (tmp_path / "secret").write_bytes(b"not the job's")
    (folder / "link").symlink_to(tmp_path / "secret")
    (folder / "model.pt").write_bytes(b"w")
    DirectorySync(folder, LocalObjects(tmp_path / "copy")).sync_once(settled=True)

    assert list(newest_manifest(tmp_path / "copy")["files"]) == ["model.pt"]


@pytest.mark.parametrize(
    ("torchrun_code", "stopped", "synced", "expected"),
    [
        (0, False, True, SUCCESS_EXIT_CODE),
        (1, True, True, PREEMPTED_EXIT_CODE),  # SIGTERM or the spot notice: saved in S3, resume me
        (-15, True, True, PREEMPTED_EXIT_CODE),
        (1, False, True, CRASH_EXIT_CODE),
        (1, True, False, SYNC_FAILED_EXIT_CODE),  # stopped, but the last sync failed: retry for the sync
        (0, False, False, SYNC_FAILED_EXIT_CODE),  # succeeded, but the last sync failed: not a crash
        (1, False, False, CRASH_EXIT_CODE),
    ],
)
def test_a_scripts_exit_maps_to_one_exit_code(torchrun_code: int, stopped: bool, synced: bool, expected: int) -> None:
    assert script_exit(torchrun_code=torchrun_code, stopped=stopped, synced=synced).exit_code == expected


def test_the_launcher_sees_which_processes_handle_sigusr1() -> None:
    handles = "import signal, time; signal.signal(signal.SIGUSR1, lambda *a: None); print(flush=True); time.sleep(30)"
    plain = "import time; print(flush=True); time.sleep(30)"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for code in (handles, plain)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            proc.stdout.readline()
        assert [catches(p.pid, signal.SIGUSR1) for p in procs] == [True, False]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


# ---- the code archive ----------------------------------------------------------------------------
def _archive(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _file(name: str, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_a_code_archive_unpacks_into_the_working_directory(tmp_path: Path) -> None:
    archive = _archive(
        tmp_path / "code.tar.gz", (_file("train.py", 0o4755), b"print('hi')"), (_file("pkg/util.py"), b"X = 1")
    )
    workdir = tmp_path / "work"
    workdir.mkdir()

    assert unpack(archive, workdir) == 2

    assert files_under(workdir) == {"pkg/util.py": b"X = 1", "train.py": b"print('hi')"}
    assert (workdir / "train.py").stat().st_mode & 0o7777 == 0o755  # no setuid from an archive


@pytest.mark.parametrize(
    "member",
    [
        (_file("/etc/cron.d/job"), b"x"),
        (_file("../outside.py"), b"x"),
        (_file("pkg/../../outside.py"), b"x"),
        (_link("pkg", "/etc", tarfile.SYMTYPE), b""),
        (_link("hard", "/etc/passwd", tarfile.LNKTYPE), b""),
    ],
    ids=["absolute", "dot-dot", "nested-dot-dot", "symlink", "hardlink"],
)
def test_an_unsafe_code_archive_is_refused_before_anything_is_written(
    tmp_path: Path, member: tuple[tarfile.TarInfo, bytes]
) -> None:
    archive = _archive(tmp_path / "code.tar.gz", (_file("train.py"), b"ok"), member)
    workdir = tmp_path / "work" / "dir"
    workdir.mkdir(parents=True)

    with pytest.raises(CodeArchiveError):
        unpack(archive, workdir)

    assert files_under(tmp_path / "work") == {}


class _FakeS3:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def download_file(self, bucket: str, key: str, filename: str) -> None:
        Path(filename).write_bytes(self.body)


def test_a_code_archive_with_another_digest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CodeArchiveError, match="has SHA-256"):
        fetch("s3://bucket/jobs/j/code/a.tar.gz", "0" * 64, tmp_path, s3=_FakeS3(b"swapped"))


# ---- the launcher, with real torchrun ------------------------------------------------------------
def _launch(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """The launcher in its own folder (``TMPDIR``), as a container starts in its WORKDIR."""
    argv = [PYTHON, "-m", "gpujobs_trainer.launch", "--", PYTHON, str(SCRIPT), *args]
    return subprocess.Popen(
        argv,
        env=env,
        cwd=env["TMPDIR"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _events(output: str, name: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == name]


def _wait_for_save(proc: subprocess.Popen[str], step: int) -> str:
    seen = ""
    deadline = time.monotonic() + 90
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        if any(e["step"] >= step for e in _events(line, "saved")):
            return seen
    raise AssertionError(f"no save at step {step}:\n{seen[-3000:]}")


@pytest.mark.training
@pytest.mark.timeout(240)
def test_a_stopped_directory_job_resumes_from_its_own_snapshot(tmp_path: Path) -> None:
    # given an unmodified script running under `checkpoint: directory`
    env = job_env(str(tmp_path / "ckpt"), GPUJOBS_CHECKPOINT_MODE="directory", TMPDIR=str(tmp_path))
    first = _launch(env, "--steps", "400", "--save-every", "10", "--step-sleep", "0.05")
    before = _wait_for_save(first, 20)

    # when it is stopped (docker stop, a policy stop, or the launcher's own spot watcher)
    os.kill(first.pid, signal.SIGTERM)
    rest, _ = first.communicate(timeout=120)

    # then the launcher reports "preempted, resume me" once the folder is synced
    assert first.returncode == PREEMPTED_EXIT_CODE, rest[-3000:]
    last_saved = max(e["step"] for e in _events(before + rest, "saved"))

    # and the next attempt, on another machine, resumes from the script's own newest snapshot
    env["TMPDIR"] = str(tmp_path / "replacement")
    Path(env["TMPDIR"]).mkdir()
    second = _launch(env, "--steps", str(last_saved + 20), "--save-every", "10")
    output, _ = second.communicate(timeout=120)
    assert second.returncode == SUCCESS_EXIT_CODE, output[-3000:]
    assert _events(output, "resumed") == [{"event": "resumed", "step": last_saved}]
    assert _events(output, "final") == [{"event": "final", "step": last_saved + 20, "resumed_from": last_saved}]


@pytest.mark.training
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["gpujobs", "directory"])
def test_a_checkpoint_now_signal_never_kills_a_script_without_a_handler(tmp_path: Path, mode: str) -> None:
    # given a script that installs no SIGUSR1 handler (its default action is to terminate)
    env = job_env(str(tmp_path / "ckpt"), GPUJOBS_CHECKPOINT_MODE=mode, TMPDIR=str(tmp_path))
    job = _launch(env, "--steps", "60", "--save-every", "10", "--step-sleep", "0.05")
    _wait_for_save(job, 10)

    # when the control plane's checkpoint-now (a rebalance notice) reaches the launcher
    os.kill(job.pid, signal.SIGUSR1)

    # then the script trains on to the end: the attempt succeeds rather than crashing
    output, _ = job.communicate(timeout=120)
    assert job.returncode == SUCCESS_EXIT_CODE, output[-3000:]
    assert _events(output, "final") == [{"event": "final", "step": 60, "resumed_from": 0}]
