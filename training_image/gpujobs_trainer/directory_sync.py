"""``checkpoint: directory``: a script's own checkpoint folder, kept in S3 and restored on resume.

For scripts that do not use the trainer library (SageMaker's checkpoint channel is the model): the
script saves and loads whatever it likes under ``$GPUJOBS_CHECKPOINT_DIR``; the launcher restores
that folder before the command starts, syncs it while it runs and once more after the workers exit.

The copy lives under ``<GPUJOBS_CHECKPOINT_URI>/dir/`` (`sync_objects`): ``blobs/<digest>`` holds
the bytes of each file, named by their BLAKE3 digest, and each sync writes one signed manifest,
``manifests/<attempt>-<sequence>.json`` (`sync_manifest`), after the blobs it lists.

- **The bytes uploaded are the bytes hashed.** A changed file is copied to a private snapshot,
  hashed on the way, and the snapshot is what is uploaded as ``blobs/<digest>``: a script that
  replaces the file meanwhile (a save by rename) cannot put other bytes under that digest. A file
  that changed while it was copied is left for the next round (it keeps its last synced entry)
  unless the workers have exited; a file is read only when its size, mtime or inode changed.
- **A restore verifies and falls back.** It tries the manifests newest first (a later attempt's
  before an earlier one's): one that is malformed, another job's or unsigned (when the job has a
  checkpoint key), or whose blobs are missing or do not match their digests is skipped, with the
  reason logged, for the one before. When manifests exist and none can be restored, the launcher
  exits 78: it never silently starts a job over.
- **Two attempts may sync at once** (a replacement starts while the old node 0 still runs). Before
  it downloads or uploads anything, a restoring attempt writes ``claims/<attempt>`` (also when there
  is nothing to restore) and a copy of the manifest it restores under its own attempt number. Only
  the newest attempt collects garbage: an attempt that sees a claim or manifest of a later one never
  deletes anything again, and it looks once more after listing the blobs, so a blob a later attempt
  uploaded is never in the list it deletes from. Garbage is what the newest `KEEP_MANIFESTS`
  valid manifests do not reach: older manifests, then blobs that none of those lists (and, while the
  attempt runs, none of the manifest it restored, which its other nodes may still be downloading).
- Symlinks and other non-regular files are not synced. Multi-node jobs: node 0's folder is the
  job's (scripts save from global rank 0); every node restores it, and only node 0 claims.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from gpujobs_trainer.digests import new_hasher
from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.sync_manifest import (
    BLOBS,
    CLAIMS,
    MANIFESTS,
    Entry,
    Manifest,
    manifest_problem,
    newest_first,
    safe_relative,
)
from gpujobs_trainer.sync_objects import LocalObjects, Objects, S3Objects, objects_for

__all__ = ["DirectorySync", "Entry", "LocalObjects", "Manifest", "Objects", "S3Objects", "local_folder", "objects_for"]

log = logging.getLogger("gpujobs_trainer.directory_sync")

KEEP_MANIFESTS = 3
"""Valid manifests kept (the newest and two to fall back on); blobs only they reach are kept."""
LEGACY_MANIFEST = "MANIFEST.json"
FINAL_SYNC_TRIES = 4
FINAL_SYNC_BACKOFF_SECONDS = 2.0
_CHUNK = 4 * 1024 * 1024
Listener = Callable[[Manifest], None]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _blob(digest: str) -> str:
    return f"{BLOBS}/{digest}"


def _signature(path: Path) -> tuple[int, int, int]:
    found = path.stat(follow_symlinks=False)
    return found.st_size, found.st_mtime_ns, found.st_ino


def _fd_signature(fd: int) -> tuple[int, int, int]:
    found = os.fstat(fd)
    return found.st_size, found.st_mtime_ns, found.st_ino


class DirectorySync:
    """Restores the folder, then keeps its copy current: `sync_once` from a thread, `finish` last."""

    def __init__(
        self,
        folder: Path,
        objects: Objects,
        *,
        job_id: str = "local",
        attempt: int = 0,
        key: bytes = b"",
        keep: int = KEEP_MANIFESTS,
        on_manifest: Listener | None = None,
    ) -> None:
        self.folder = folder
        self.objects = objects
        self.job_id, self.attempt, self.key = job_id, attempt, key
        self.keep = max(2, keep)
        self.on_manifest = on_manifest
        self.last_manifest: Manifest | None = None
        """The newest manifest this attempt wrote (or restored): what a heartbeat reports."""
        self.skipped: list[str] = []
        """Manifests the restore skipped, each with why."""
        self.superseded = False
        """Whether a later attempt's manifest was seen: this one then never deletes anything."""
        self._synced: dict[str, Entry] = {}
        self._uploaded: set[str] = set()  # digests of blobs known to be in the copy
        self._pinned: frozenset[str] = frozenset()  # the restored manifest's blobs
        self._seen: dict[str, tuple[tuple[int, int, int], Entry]] = {}  # name -> (stat signature, entry)
        self._known: dict[str, Manifest | None] = {}  # manifest name -> parsed and valid (None: not)
        self._sequence = 0
        self._scratch: Path | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- restoring ----------------------------------------------------------------------------
    def restore(self, *, claim: bool = True) -> int:
        """Fill the (empty) folder from the newest manifest that can be restored; returns how many
        files it restored. ``claim``: this is the node that syncs (node 0), so it claims the manifest."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if claim:  # before anything is uploaded: an older attempt that still syncs stops deleting
            self.objects.write(f"{CLAIMS}/{self.attempt:06d}", _now().encode())
        if self.objects.read(LEGACY_MANIFEST) is not None:
            log.warning("ignoring %s%s: no launcher of this version writes it", self.objects.where, LEGACY_MANIFEST)
        candidates = newest_first(self.objects.names(MANIFESTS))
        if not candidates:
            log.info("no synced checkpoint folder at %s: starting with an empty %s", self.objects.where, self.folder)
            return 0
        for _, _, name in candidates:
            manifest, problem = self._valid(name)
            if manifest is None:
                self._skip(name, problem)
                continue
            claimed = self._claim(manifest) if claim else None
            try:
                self._download(manifest)
            except (CheckpointError, OSError) as exc:
                self._skip(name, str(exc))
                if claimed is not None and claimed != name:
                    with contextlib.suppress(Exception):
                        self.objects.delete(f"{MANIFESTS}/{claimed}")
                continue
            self._synced = dict(manifest.files)
            self._uploaded = set(manifest.digests)
            self._pinned = manifest.digests
            self._sequence = manifest.sequence
            self.last_manifest = manifest
            log.info(
                "restored %d file(s) of %s%s/%s into %s",
                len(manifest.files),
                self.objects.where,
                MANIFESTS,
                name,
                self.folder,
            )
            return len(manifest.files)
        raise CheckpointError(
            f"no synced folder at {self.objects.where} can be restored: {len(candidates)} manifest(s), "
            f"all skipped: {'; '.join(self.skipped[:5])}"
        )

    def _skip(self, name: str, problem: str) -> None:
        self.skipped.append(f"{name}: {problem}")
        log.warning("skipping the synced folder's manifest %s: %s", name, problem)

    def _valid(self, name: str) -> tuple[Manifest | None, str]:
        """The manifest ``name`` if it is this job's (signed with its key, when it has one)."""
        if name in self._known:
            known = self._known[name]
            return known, "" if known is not None else "invalid"
        data = self.objects.read(f"{MANIFESTS}/{name}")
        try:
            if data is None:
                raise CheckpointError("it is gone")
            manifest = Manifest.from_bytes(data)
            problem = manifest_problem(manifest, name=name, job_id=self.job_id, key=self.key)
        except CheckpointError as exc:
            manifest, problem = None, str(exc)
        valid = manifest if not problem else None
        self._known[name] = valid
        return valid, problem

    def _claim(self, base: Manifest) -> str:
        """Record, before downloading, that this attempt continues from ``base``: an older attempt
        that still syncs sees it and stops deleting."""
        claim = Manifest(
            job_id=self.job_id, attempt=self.attempt, sequence=base.sequence, time=_now(), files=base.files
        )
        self.objects.write(f"{MANIFESTS}/{claim.name}", claim.to_bytes(self.key))
        self._known[claim.name] = claim
        return claim.name

    def _download(self, manifest: Manifest) -> None:
        """Every listed file, each blob verified against its size and digest before it is moved in."""
        scratch = self._scratch_dir()
        fetched: dict[str, Path] = {}
        written: list[Path] = []
        try:
            for name, entry in sorted(manifest.files.items()):
                target = self.folder / safe_relative(name)
                if entry.digest not in fetched:
                    staged = scratch / f"restore-{len(fetched)}"
                    self.objects.download(_blob(entry.digest), staged)
                    size, digest = _measure(staged)
                    if (size, digest) != (entry.size, entry.digest):
                        raise CheckpointError(f"{name}: blob {entry.digest[:16]}... holds other bytes than listed")
                    fetched[entry.digest] = staged
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(fetched[entry.digest], target)
                written.append(target)
                self._seen[name] = (_signature(target), entry)  # unchanged since: never read again
        except Exception:
            for path in written:
                path.unlink(missing_ok=True)
            self._seen.clear()
            raise
        finally:
            for staged in fetched.values():
                staged.unlink(missing_ok=True)

    # ---- syncing ------------------------------------------------------------------------------
    def _scratch_dir(self) -> Path:
        """A private folder beside the synced one (same file system): snapshots and downloads."""
        if self._scratch is None:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            self._scratch = Path(tempfile.mkdtemp(prefix=".gpujobs-sync-", dir=self.folder.parent))
        return self._scratch

    def _snapshot(self, path: Path, index: int) -> tuple[Entry, Path, tuple[int, int, int], bool]:
        """Copy ``path`` to a private snapshot, hashing what is copied: its entry, the snapshot, the
        signature of the file copied, and whether that file changed while it was copied. The file
        stays open throughout, so a save that renames a new file over it meanwhile (the usual way)
        leaves the copy whole: only a file written in place can change under it."""
        snapshot = self._scratch_dir() / f"snapshot-{index}"
        hasher, size = new_hasher(), 0
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # never a link, never block on a FIFO
        with os.fdopen(os.open(path, flags), "rb") as source, open(snapshot, "wb") as copy:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                raise IsADirectoryError(f"{path} is no longer a regular file")
            before = _fd_signature(source.fileno())
            while chunk := source.read(_CHUNK):
                hasher.update(chunk)
                copy.write(chunk)
                size += len(chunk)
            changed = _fd_signature(source.fileno()) != before
        return Entry(hasher.hexdigest(), size), snapshot, before, changed

    def _scan(self, *, settled: bool) -> tuple[dict[str, Entry], dict[str, Path], dict[str, tuple[int, int, int]]]:
        """Regular files under the folder with their entries; a snapshot of each whose bytes may not
        be in the copy yet. A file that changes while it is copied keeps its last synced entry (or
        is left out) unless ``settled`` (nothing writes any more)."""
        files: dict[str, Entry] = {}
        snapshots: dict[str, Path] = {}
        signatures: dict[str, tuple[int, int, int]] = {}
        for path in sorted(self.folder.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            name = path.relative_to(self.folder).as_posix()
            try:
                signature = _signature(path)
                cached = self._seen.get(name)
                if cached is not None and cached[0] == signature and cached[1].digest in self._uploaded:
                    files[name] = cached[1]
                    continue
                entry, snapshot, signature, changed = self._snapshot(path, len(snapshots))
            except OSError:  # removed, or replaced by a link or a folder, while scanned
                continue
            if changed and not settled:
                snapshot.unlink()
                if name in self._synced:
                    files[name] = self._synced[name]
                continue
            files[name], snapshots[name], signatures[name] = entry, snapshot, signature
        return files, snapshots, signatures

    def sync_once(self, *, settled: bool = False) -> bool:
        """Upload what changed, then a new manifest; returns whether one was written."""
        with self._lock:
            files, snapshots, signatures = self._scan(settled=settled)
            try:
                if files == self._synced:
                    return False
                for name, snapshot in snapshots.items():
                    digest = files[name].digest
                    if digest not in self._uploaded:
                        self.objects.upload(snapshot, _blob(digest))
                        self._uploaded.add(digest)
                self._sequence += 1
                manifest = Manifest(
                    job_id=self.job_id, attempt=self.attempt, sequence=self._sequence, time=_now(), files=files
                )
                self.objects.write(f"{MANIFESTS}/{manifest.name}", manifest.to_bytes(self.key))
            finally:
                for snapshot in snapshots.values():
                    snapshot.unlink(missing_ok=True)
            self._known[manifest.name] = manifest
            self._seen.update({name: (signatures[name], files[name]) for name in signatures})
            self._synced, self.last_manifest = files, manifest
            log.info("synced %s: %d file(s), manifest %s", self.folder, len(files), manifest.name)
            self._collect_garbage_safely()
        if self.on_manifest is not None:
            self.on_manifest(manifest)
        return True

    # ---- garbage ------------------------------------------------------------------------------
    def _collect_garbage_safely(self) -> None:
        try:
            self.collect_garbage()
        except Exception:  # housekeeping: the next sync tries again
            log.warning("cleaning up the synced folder's copy failed; will retry", exc_info=True)

    def collect_garbage(self) -> None:
        """Delete what the newest `keep` valid manifests do not reach, unless a later attempt exists
        (it is the one that cleans up then). Blobs of the restored manifest stay while pinned."""
        listed = newest_first(self.objects.names(MANIFESTS))
        if self._later_attempt_seen(listed):
            return
        valid = [(name, manifest) for _, _, name in listed if (manifest := self._valid(name)[0]) is not None]
        kept = valid[: self.keep]
        reachable = set(self._pinned).union(*(manifest.digests for _, manifest in kept))
        blobs = self.objects.names(BLOBS)
        # A later attempt writes its claim before it uploads anything: any blob of one that started
        # since the manifests were listed is in `blobs` only if its claim is visible now.
        if self._later_attempt_seen(newest_first(self.objects.names(MANIFESTS))):
            return
        for name, _ in valid[self.keep :]:
            self.objects.delete(f"{MANIFESTS}/{name}")
            self._known.pop(name, None)
        for digest in blobs:
            if digest not in reachable:
                self.objects.delete(_blob(digest))
                self._uploaded.discard(digest)

    def _later_attempt_seen(self, listed: list[tuple[int, int, str]]) -> bool:
        """Whether a later attempt's manifest or claim exists: then this one never deletes again."""
        claims = [int(name) for name in self.objects.names(CLAIMS) if name.isdigit()]
        if self.superseded or any(a > self.attempt for a, _, _ in listed) or any(a > self.attempt for a in claims):
            if not self.superseded:
                log.info("a later attempt syncs %s too: this one deletes nothing from now on", self.objects.where)
            self.superseded = True
        return self.superseded

    # ---- running ------------------------------------------------------------------------------
    def start(self, interval: float) -> None:
        """Sync every `interval` seconds until `finish`; a failed round is logged and tried again."""

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.sync_once()
                except Exception:  # the next round retries; finish() reports what is left
                    log.warning("syncing %s failed; will retry", self.folder, exc_info=True)

        self._thread = threading.Thread(target=loop, name="gpujobs-directory-sync", daemon=True)
        self._thread.start()

    def finish(self, *, tries: int = FINAL_SYNC_TRIES, sleep: Callable[[float], object] = time.sleep) -> None:
        """The last sync, once the workers have exited, tried ``tries`` times with backoff; raises
        when it cannot be completed. Then the pin on the restored manifest's blobs goes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            for attempt in range(1, tries + 1):
                try:
                    self.sync_once(settled=True)
                    break
                except Exception as exc:
                    if attempt == tries:
                        raise
                    pause = FINAL_SYNC_BACKOFF_SECONDS * 2 ** (attempt - 1)
                    log.warning(
                        "the last sync of %s failed (try %d): %s; again in %.0f s", self.folder, attempt, exc, pause
                    )
                    sleep(pause)
            self._pinned = frozenset()
            with self._lock:
                self._collect_garbage_safely()
        finally:
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)


def _measure(path: Path) -> tuple[int, str]:
    hasher, size = new_hasher(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return size, hasher.hexdigest()


def local_folder(env: Mapping[str, str]) -> Path:
    """A fresh local folder for ``$GPUJOBS_CHECKPOINT_DIR`` (on the image's checkpoint volume)."""
    base = env.get("GPUJOBS_LOCAL_CHECKPOINT_DIR", "") or tempfile.gettempdir()
    Path(base).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="checkpoint-dir-", dir=base))
