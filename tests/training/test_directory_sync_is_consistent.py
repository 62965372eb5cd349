"""`checkpoint: directory` under every order of events: a folder saved by rename while it syncs, two
attempts syncing one folder, planted or foreign manifests, a last sync that fails, progress reports.

The folder's copy is a local path (`LocalObjects`), which the same code writes to S3 on an instance;
the moments that matter (a save landing between a file's hash and its upload, an old attempt's last
sync after its replacement started) are made to happen by the store itself, not by timing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from gpujobs_trainer.directory_sync import DirectorySync, Entry, LocalObjects, Manifest
from gpujobs_trainer.errors import PREEMPTED_EXIT_CODE, SUCCESS_EXIT_CODE, SYNC_FAILED_EXIT_CODE, CheckpointError
from gpujobs_trainer.events import CHECKPOINT_COMMITTED, TRAINING_HEARTBEAT
from gpujobs_trainer.script_checkpoints import DIRECTORY, NONE, SYNC_REASON, ProgressReports, ScriptCheckpoints
from gpujobs_trainer.sync_manifest import MANIFESTS

KEY = bytes(range(32))
OTHER_JOBS_KEY = bytes(range(32, 64))


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def save_by_rename(folder: Path, body: bytes, name: str = "ckpt.pt") -> None:
    """What most scripts do: write a temporary file, then rename it over the checkpoint."""
    staged = folder / f".{name}.tmp"
    staged.write_bytes(body)
    os.replace(staged, folder / name)


def restored(copy: Path, into: Path, **kwargs: Any) -> dict[str, bytes]:
    """What a node that does not sync (claim=False) restores from the copy now."""
    DirectorySync(into, LocalObjects(copy), **kwargs).restore(claim=False)
    return files_under(into)


class SavesBetweenHashAndUpload(LocalObjects):
    """The script saves a new version by rename after the sync hashed the file, before its upload."""

    def __init__(self, root: Path, folder: Path, newer: bytes) -> None:
        super().__init__(root)
        self.folder, self.newer = folder, newer

    def upload(self, path: Path, key: str) -> None:
        if self.newer:
            save_by_rename(self.folder, self.newer)
            self.newer = b""
        super().upload(path, key)


# ---- the bytes uploaded are the bytes hashed ------------------------------------------------------
def test_a_file_replaced_between_its_hash_and_its_upload_is_restored_as_hashed(tmp_path: Path) -> None:
    # given a folder whose checkpoint the script replaces by rename just as the sync uploads it
    folder, copy = tmp_path / "run", tmp_path / "copy"
    folder.mkdir()
    save_by_rename(folder, b"step-10 " * 1000)
    sync = DirectorySync(folder, SavesBetweenHashAndUpload(copy, folder, newer=b"step-20 " * 1000))

    # when that sync and the next complete
    assert sync.sync_once()
    first = restored(copy, tmp_path / "after-first")
    assert sync.sync_once()

    # then each manifest restores the very bytes it was hashed from: the old save, then the new one
    assert first == {"ckpt.pt": b"step-10 " * 1000}
    assert restored(copy, tmp_path / "after-second") == {"ckpt.pt": b"step-20 " * 1000}


def test_a_script_saving_by_rename_every_few_ms_never_leaves_a_manifest_that_cannot_be_restored(
    tmp_path: Path,
) -> None:
    folder, copy = tmp_path / "run", tmp_path / "copy"
    folder.mkdir()
    save_by_rename(folder, b"step-0")
    stop = threading.Event()

    def script() -> None:
        step = 0
        while not stop.wait(0.002):
            step += 1
            save_by_rename(folder, f"step-{step}|".encode() * 5000)

    saver = threading.Thread(target=script)
    saver.start()
    sync = DirectorySync(folder, LocalObjects(copy))
    try:
        for round_ in range(40):
            sync.sync_once()
            body = restored(copy, tmp_path / f"restore-{round_}")["ckpt.pt"]
            record = body[: body.index(b"|") + 1] if b"|" in body else body
            assert body == record * (len(body) // len(record)), f"round {round_}: a torn file was restored"
    finally:
        stop.set()
        saver.join()


def test_a_manifest_whose_blob_holds_other_bytes_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    folder, copy = tmp_path / "run", tmp_path / "copy"
    folder.mkdir()
    sync = DirectorySync(folder, LocalObjects(copy))
    save_by_rename(folder, b"step-10")
    sync.sync_once(settled=True)
    save_by_rename(folder, b"step-20")
    sync.sync_once(settled=True)
    newest = sync.last_manifest
    assert newest is not None
    (copy / "blobs" / newest.files["ckpt.pt"].digest).write_bytes(b"step-2X")  # a torn or tampered blob

    replacement = DirectorySync(tmp_path / "replacement", LocalObjects(copy), attempt=1)
    replacement.restore()

    assert files_under(tmp_path / "replacement") == {"ckpt.pt": b"step-10"}
    assert replacement.skipped == [
        f"{newest.name}: ckpt.pt: blob {newest.files['ckpt.pt'].digest[:16]}... holds other bytes than listed"
    ]


# ---- two attempts, one folder ---------------------------------------------------------------------
def test_an_old_attempts_last_sync_never_deletes_what_its_replacement_restored_or_wrote(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    # given attempt 1 syncing its folder
    old_folder = tmp_path / "old"
    old_folder.mkdir()
    (old_folder / "weights.pt").write_bytes(b"weights at step 10")
    old = DirectorySync(old_folder, LocalObjects(copy), attempt=1)
    old.sync_once(settled=True)

    # and its replacement, started while attempt 1's node 0 still lives: restored, then synced once
    new_folder = tmp_path / "new"
    new = DirectorySync(new_folder, LocalObjects(copy), attempt=2)
    new.restore()
    save_by_rename(new_folder, b"the replacement's step 30", name="optimizer.pt")
    new.sync_once(settled=True)

    # when attempt 1 saves once more and makes its last sync
    (old_folder / "weights.pt").write_bytes(b"weights at step 20, attempt 1")
    old.finish()

    # then it deleted nothing: the next attempt restores the replacement's folder in full
    assert old.superseded
    assert restored(copy, tmp_path / "next", attempt=3) == {
        "optimizer.pt": b"the replacement's step 30",
        "weights.pt": b"weights at step 10",
    }


def test_a_replacement_that_has_not_synced_yet_is_safe_from_its_predecessors_last_sync(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    old_folder = tmp_path / "old"
    old_folder.mkdir()
    (old_folder / "weights.pt").write_bytes(b"step 10")
    old = DirectorySync(old_folder, LocalObjects(copy), attempt=1)
    old.sync_once(settled=True)
    new = DirectorySync(tmp_path / "new", LocalObjects(copy), attempt=2)
    new.restore()  # its claim is written before it downloads anything

    (old_folder / "weights.pt").write_bytes(b"step 11")
    old.finish()
    (new.folder / "log.txt").write_bytes(b"resumed")
    new.sync_once(settled=True)  # lists weights.pt by the digest it restored, uploaded by attempt 1

    assert restored(copy, tmp_path / "next", attempt=3) == {"log.txt": b"resumed", "weights.pt": b"step 10"}


def test_the_newest_attempt_collects_what_no_kept_manifest_reaches(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    old_folder = tmp_path / "old"
    old_folder.mkdir()
    (old_folder / "a.pt").write_bytes(b"attempt 1")
    DirectorySync(old_folder, LocalObjects(copy), attempt=1).sync_once(settled=True)
    new = DirectorySync(tmp_path / "new", LocalObjects(copy), attempt=2, keep=2)
    new.restore()
    for step in range(3):
        save_by_rename(new.folder, f"attempt 2, step {step}".encode(), name="a.pt")
        new.sync_once(settled=True)
    new.finish()

    manifests = sorted(p.name for p in (copy / MANIFESTS).iterdir())
    assert manifests == ["000002-00000003.json", "000002-00000004.json"]
    assert len(list((copy / "blobs").iterdir())) == 2


# ---- whose manifest it is -------------------------------------------------------------------------
def _plant(copy: Path, manifest: Manifest, key: bytes, blobs: dict[str, bytes]) -> None:
    store = LocalObjects(copy)
    for digest, body in blobs.items():
        store.write(f"blobs/{digest}", body)
    store.write(f"{MANIFESTS}/{manifest.name}", manifest.to_bytes(key))


def test_a_planted_or_foreign_manifest_is_skipped_and_the_newest_signed_one_restored(tmp_path: Path) -> None:
    # given a job's folder, synced with its checkpoint key
    folder, copy = tmp_path / "run", tmp_path / "copy"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"the job's own weights")
    DirectorySync(folder, LocalObjects(copy), job_id="j-a", attempt=1, key=KEY).sync_once(settled=True)

    # and two newer manifests someone else wrote: one unsigned, one signed by another job relabelled
    evil = "e" * 64
    for attempt, key in ((5, b""), (6, OTHER_JOBS_KEY)):
        manifest = Manifest(job_id="j-a", attempt=attempt, sequence=1, time="t", files={"model.pt": Entry(evil, 4)})
        _plant(copy, manifest, key, {evil: b"evil"})

    # when the next attempt restores
    replacement = DirectorySync(tmp_path / "next", LocalObjects(copy), job_id="j-a", attempt=2, key=KEY)
    replacement.restore()

    # then it restored the job's own files, and says which manifests it skipped, and why
    assert files_under(tmp_path / "next") == {"model.pt": b"the job's own weights"}
    assert [line.split(":")[0] for line in replacement.skipped] == ["000006-00000001.json", "000005-00000001.json"]
    assert "is not this job's" in replacement.skipped[0]
    assert "not signed" in replacement.skipped[1]


def test_another_jobs_manifest_is_not_restored_even_without_keys(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    theirs = Manifest(job_id="j-other", attempt=1, sequence=9, time="t", files={"m.pt": Entry("e" * 64, 4)})
    _plant(copy, theirs, b"", {"e" * 64: b"evil"})

    with pytest.raises(CheckpointError, match="belongs to job 'j-other'"):
        DirectorySync(tmp_path / "run", LocalObjects(copy), job_id="j-a").restore()
    assert files_under(tmp_path / "run") == {}


# ---- the last sync, and progress ------------------------------------------------------------------
class Recorder:
    """A publisher that keeps what it was given."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        self.events.append((detail_type, detail))

    def close(self) -> None:
        """Nothing to flush."""


class FailsManifestWrites(LocalObjects):
    def __init__(self, root: Path, failures: int) -> None:
        super().__init__(root)
        self.failures = failures

    def write(self, key: str, data: bytes) -> None:
        if key.startswith(MANIFESTS) and self.failures:
            self.failures -= 1
            raise ConnectionError("S3 unreachable")
        super().write(key, data)


@pytest.mark.parametrize(("failures", "code"), [(2, SUCCESS_EXIT_CODE), (10, SYNC_FAILED_EXIT_CODE)])
def test_the_last_sync_of_a_script_that_succeeded_is_retried_and_a_failure_said_apart_from_a_crash(
    tmp_path: Path, failures: int, code: int
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "final.pt").write_bytes(b"done")
    pauses: list[float] = []
    own = ScriptCheckpoints(
        DIRECTORY,
        folder,
        sync=DirectorySync(folder, FailsManifestWrites(tmp_path / "copy", failures)),
        final_sync_sleep=pauses.append,
    )

    outcome = own.finish(torchrun_code=0, stopped=False)

    assert outcome.exit_code == code
    assert pauses == [2.0, 4.0] if code == SUCCESS_EXIT_CODE else pauses == [2.0, 4.0, 8.0]
    if code == SUCCESS_EXIT_CODE:
        assert restored(tmp_path / "copy", tmp_path / "next", attempt=1) == {"final.pt": b"done"}


def test_a_stopped_script_whose_last_sync_passes_on_a_retry_is_preempted(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "ckpt.pt").write_bytes(b"saved on SIGTERM")
    own = ScriptCheckpoints(
        DIRECTORY,
        folder,
        sync=DirectorySync(folder, FailsManifestWrites(tmp_path / "copy", 1)),
        final_sync_sleep=lambda _: None,
    )
    assert own.finish(torchrun_code=1, stopped=True).exit_code == PREEMPTED_EXIT_CODE


def test_every_sync_is_reported_as_a_checkpoint_whose_step_grows_across_attempts(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    events: list[tuple[str, dict[str, Any]]] = []
    for attempt in (1, 2):
        recorder = Recorder()
        reports = ProgressReports(
            recorder, job_id="j-a", attempt=attempt, mode=DIRECTORY, where=f"{copy}/", interval=60
        )
        sync = DirectorySync(
            tmp_path / f"run-{attempt}", LocalObjects(copy), attempt=attempt, on_manifest=reports.committed
        )
        sync.restore()
        reports.restored(sync.last_manifest)
        reports.heartbeat()
        for step in range(2):
            save_by_rename(sync.folder, f"attempt {attempt} step {step}".encode())
            sync.sync_once()
        reports.heartbeat()
        events += recorder.events

    commits = [d for t, d in events if t == CHECKPOINT_COMMITTED]
    beats = [d for t, d in events if t == TRAINING_HEARTBEAT]
    assert [(c["attempt"], c["step"]) for c in commits] == [(1, 1), (1, 2), (2, 3), (2, 4)]
    assert {c["reason"] for c in commits} == {SYNC_REASON}
    assert commits[-1]["uri"] == f"{copy}/{MANIFESTS}/000002-00000004.json"
    assert [(b["attempt"], b["step"]) for b in beats] == [(1, 0), (1, 2), (2, 2), (2, 4)]
    assert all(b["source"] == "launcher" and b["progress"] == "sync-sequence" for b in beats)
    assert beats[-1]["synced_at"] == commits[-1]["time"]


def test_a_none_script_still_reports_that_it_runs(tmp_path: Path) -> None:
    recorder = Recorder()
    reports = ProgressReports(recorder, job_id="j-a", attempt=3, mode=NONE, where="", interval=60)
    reports.heartbeat()
    [(detail_type, detail)] = recorder.events
    assert detail_type == TRAINING_HEARTBEAT
    assert (detail["job_id"], detail["attempt"], detail["step"], detail["progress"]) == ("j-a", 3, 0, "none")


class ReplacementStartsWhileBlobsAreListed(LocalObjects):
    """The old attempt's store: between its garbage collection's look at the manifests and its
    listing of the blobs, the replacement claims, restores, and uploads a new blob."""

    def __init__(self, root: Path, meanwhile: Any) -> None:
        super().__init__(root)
        self.meanwhile = meanwhile

    def names(self, folder: str) -> list[str]:
        if folder == "blobs" and self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()
        return super().names(folder)


def test_a_replacement_that_starts_during_its_predecessors_garbage_collection_loses_nothing(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    old_folder = tmp_path / "old"
    old_folder.mkdir()
    (old_folder / "weights.pt").write_bytes(b"step 10")
    new = DirectorySync(tmp_path / "new", LocalObjects(copy), attempt=2)

    def replacement_starts() -> None:
        new.restore()
        save_by_rename(new.folder, b"the replacement's step 30", name="optimizer.pt")
        uploads_only = SavesManifestLater(copy)  # its blob is in S3, its manifest not yet
        new.objects = uploads_only
        with pytest.raises(ConnectionError):
            new.sync_once(settled=True)

    old = DirectorySync(old_folder, LocalObjects(copy), attempt=1)
    old.sync_once(settled=True)
    old.objects = ReplacementStartsWhileBlobsAreListed(copy, replacement_starts)
    (old_folder / "weights.pt").write_bytes(b"step 11")
    old.sync_once(settled=True)  # its garbage collection runs across the replacement's start

    new.objects = LocalObjects(copy)
    (new.folder / "log.txt").write_bytes(b"resumed")
    new.sync_once(settled=True)  # the manifest that lists the blob uploaded before
    assert restored(copy, tmp_path / "next", attempt=3) == {
        "log.txt": b"resumed",
        "optimizer.pt": b"the replacement's step 30",
        "weights.pt": b"step 11",
    }


class SavesManifestLater(LocalObjects):
    """Uploads blobs, but its manifest write fails (the replacement dies or stalls in between)."""

    def write(self, key: str, data: bytes) -> None:
        if key.startswith(f"{MANIFESTS}/"):
            raise ConnectionError("S3 unreachable")
        super().write(key, data)


def test_a_replacement_with_nothing_to_restore_is_safe_from_its_predecessors_first_sync(tmp_path: Path) -> None:
    # given attempt 1 that has not synced yet, and its replacement started with nothing to restore
    copy = tmp_path / "copy"
    old_folder = tmp_path / "old"
    old_folder.mkdir()
    new = DirectorySync(tmp_path / "new", LocalObjects(copy), attempt=2)
    assert new.restore() == 0
    save_by_rename(new.folder, b"the replacement's step 5")
    new.objects = SavesManifestLater(copy)
    with pytest.raises(ConnectionError):
        new.sync_once(settled=True)  # its blob is uploaded; its manifest is not written yet

    # when attempt 1 makes its first (and last) sync
    (old_folder / "late.pt").write_bytes(b"attempt 1's late save")
    old = DirectorySync(old_folder, LocalObjects(copy), attempt=1)
    old.finish()

    # then it deleted nothing of the replacement's: its next sync restores whole
    new.objects = LocalObjects(copy)
    new.sync_once(settled=True)
    assert old.superseded
    assert restored(copy, tmp_path / "next", attempt=3) == {"ckpt.pt": b"the replacement's step 5"}
