"""``checkpoint: directory``: a script's own checkpoint folder, kept in S3 and restored on resume.

For scripts that do not use the trainer library (SageMaker's checkpoint channel is the model): the
script saves and loads whatever it likes under ``$GPUJOBS_CHECKPOINT_DIR``; the launcher restores
that folder before the command starts, syncs it while it runs and once more after the workers exit.

The copy lives under ``<GPUJOBS_CHECKPOINT_URI>/dir/``:

* ``blobs/<sha256>``: the bytes of each file, named by their digest, so a blob never changes once
  written and a file that did not change is never uploaded again;
* ``MANIFEST.json``: relative path -> digest and size for every file, written last. One PUT
  replaces it whole, so a restore sees the previous sync or this one, never half of each: a sync
  cut short by the instance going away leaves the last complete manifest in place.

Blobs that the previous manifest listed and the new one does not are deleted after the new one is
written, except those of the manifest the attempt was restored from (another node may still be
restoring them); the last sync deletes every blob its manifest does not list. A file is read only when its size or mtime changed, and is skipped for this round when it
changes while being read (a save in progress); the final sync runs after the workers have exited,
when nothing writes any more. Symlinks and other non-regular files are not synced. Multi-node jobs:
node 0's folder is the job's (scripts save from global rank 0); every node restores it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol
from urllib.parse import urlparse

from gpujobs_trainer.errors import CheckpointError

log = logging.getLogger("gpujobs_trainer.directory_sync")

MANIFEST = "MANIFEST.json"
MANIFEST_VERSION = 1
SYNC_SUBFOLDER = "dir"


class Objects(Protocol):
    """Where the folder's copy lives: S3 in production, a local folder in tests."""

    where: str

    def read(self, key: str) -> bytes | None: ...
    def upload(self, path: Path, key: str) -> None: ...
    def write(self, key: str, data: bytes) -> None: ...
    def download(self, key: str, path: Path) -> None: ...
    def delete(self, key: str) -> None: ...
    def names(self, folder: str) -> list[str]: ...


class S3Objects:
    """Keys under ``s3://bucket/prefix/``; boto3 honours AWS_ENDPOINT_URL (moto, the local cloud)."""

    def __init__(self, bucket: str, prefix: str) -> None:
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.where = f"s3://{bucket}/{self.prefix}/"
        self._s3: Any = boto3.client("s3", config=Config(retries={"max_attempts": 8, "mode": "adaptive"}))

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def read(self, key: str) -> bytes | None:
        try:
            return bytes(self._s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read())
        except self._s3.exceptions.NoSuchKey:
            return None

    def upload(self, path: Path, key: str) -> None:
        self._s3.upload_file(str(path), self.bucket, self._key(key))

    def write(self, key: str, data: bytes) -> None:
        self._s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def download(self, key: str, path: Path) -> None:
        self._s3.download_file(self.bucket, self._key(key), str(path))

    def delete(self, key: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(key))

    def names(self, folder: str) -> list[str]:
        base = self._key(folder) + "/"
        pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base)
        return [obj["Key"][len(base) :] for page in pages for obj in page.get("Contents", [])]


class LocalObjects:
    """Keys as files under a local folder (tests, and a local GPUJOBS_CHECKPOINT_URI)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = f"{root}/"

    def read(self, key: str) -> bytes | None:
        path = self.root / key
        return path.read_bytes() if path.is_file() else None

    def upload(self, path: Path, key: str) -> None:
        (self.root / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, self.root / key)

    def write(self, key: str, data: bytes) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.tmp")
        staged.write_bytes(data)
        staged.replace(target)

    def download(self, key: str, path: Path) -> None:
        shutil.copyfile(self.root / key, path)

    def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)

    def names(self, folder: str) -> list[str]:
        base = self.root / folder
        return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def objects_for(checkpoint_uri: str) -> Objects:
    """The copy's location: ``dir/`` under the job's checkpoint URI (s3://, file:// or a path)."""
    parsed = urlparse(checkpoint_uri)
    if parsed.scheme == "s3" and parsed.netloc:
        return S3Objects(parsed.netloc, f"{parsed.path.strip('/')}/{SYNC_SUBFOLDER}".lstrip("/"))
    if parsed.scheme in ("", "file"):
        return LocalObjects(Path(parsed.path) / SYNC_SUBFOLDER)
    raise CheckpointError(f"checkpoint URI {checkpoint_uri!r}: unsupported for checkpoint: directory")


@dataclass(frozen=True)
class Entry:
    sha256: str
    size: int


def safe_relative(name: str) -> PurePosixPath:
    """``name`` as a path inside the folder, or CheckpointError (absolute, ``..``, empty parts)."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or any(part in ("", ".", "..") for part in name.split("/")):
        raise CheckpointError(f"{MANIFEST} lists {name[:120]!r}, which is not a path inside the folder")
    return path


def parse_manifest(data: bytes) -> dict[str, Entry]:
    """The files a manifest lists, each a safe relative path with a digest and a size."""
    try:
        raw = json.loads(data)
        if raw["version"] != MANIFEST_VERSION:
            raise ValueError(f"version {raw['version']!r}")
        files = {str(n): Entry(str(e["sha256"]), int(e["size"])) for n, e in dict(raw["files"]).items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{MANIFEST} is malformed: {exc}") from exc
    for name, entry in files.items():
        safe_relative(name)
        if len(entry.sha256) != 64 or entry.size < 0:
            raise CheckpointError(f"{MANIFEST} entry {name!r} has no valid digest and size")
    return files


def manifest_bytes(files: dict[str, Entry], *, sequence: int) -> bytes:
    listed = {n: {"sha256": e.sha256, "size": e.size} for n, e in sorted(files.items())}
    return json.dumps({"version": MANIFEST_VERSION, "sequence": sequence, "files": listed}, indent=1).encode()


def _digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


class DirectorySync:
    """Restores the folder, then keeps its copy current: `sync_once` from a thread, `finish` last."""

    def __init__(self, folder: Path, objects: Objects) -> None:
        self.folder = folder
        self.objects = objects
        self._synced: dict[str, Entry] = {}
        self._pinned: frozenset[str] = frozenset()  # the restored manifest's blobs
        self._seen: dict[str, tuple[int, int, Entry]] = {}  # name -> (size, mtime_ns, entry)
        self._sequence = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def restore(self) -> int:
        """Fill the (empty) folder from the last complete sync; returns how many files it restored."""
        self.folder.mkdir(parents=True, exist_ok=True)
        data = self.objects.read(MANIFEST)
        if data is None:
            log.info("no synced checkpoint folder at %s: starting with an empty %s", self.objects.where, self.folder)
            return 0
        files = parse_manifest(data)
        self._sequence = int(json.loads(data).get("sequence", 0))
        for name, entry in files.items():
            target = self.folder / safe_relative(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.objects.download(f"blobs/{entry.sha256}", target)
            if target.stat().st_size != entry.size or _digest(target) != entry.sha256:
                raise CheckpointError(f"{name} restored from {self.objects.where} does not match its digest")
        self._synced = files
        self._pinned = frozenset(e.sha256 for e in files.values())
        log.info("restored %d file(s) from %s into %s", len(files), self.objects.where, self.folder)
        return len(files)

    def _scan(self, *, settled: bool) -> dict[str, Entry]:
        """Regular files under the folder with their digests; a file that changes while it is read
        keeps its last synced entry (or is left out) unless `settled` (nothing writes any more)."""
        found: dict[str, Entry] = {}
        for path in sorted(self.folder.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            name = path.relative_to(self.folder).as_posix()
            before = path.stat()
            cached = self._seen.get(name)
            if cached is not None and cached[:2] == (before.st_size, before.st_mtime_ns):
                found[name] = cached[2]
                continue
            entry = Entry(_digest(path), before.st_size)
            after = path.stat()
            if not settled and (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
                if name in self._synced:
                    found[name] = self._synced[name]
                continue
            self._seen[name] = (before.st_size, before.st_mtime_ns, entry)
            found[name] = entry
        return found

    def sync_once(self, *, settled: bool = False) -> bool:
        """Upload what changed, then the manifest; returns whether a new manifest was written."""
        with self._lock:
            files = self._scan(settled=settled)
            if files == self._synced:
                return False
            uploaded = {e.sha256 for e in self._synced.values()}
            for name, entry in files.items():
                if entry.sha256 not in uploaded:
                    self.objects.upload(self.folder / name, f"blobs/{entry.sha256}")
                    uploaded.add(entry.sha256)
            self._sequence += 1
            self.objects.write(MANIFEST, manifest_bytes(files, sequence=self._sequence))
            kept = {e.sha256 for e in files.values()} | self._pinned
            for gone in {e.sha256 for e in self._synced.values()} - kept:
                self.objects.delete(f"blobs/{gone}")
            self._synced = files
            log.info("synced %s: %d file(s), manifest %d", self.folder, len(files), self._sequence)
            return True

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

    def finish(self) -> None:
        """The last sync, once the workers have exited; raises when it cannot be completed. Then
        every blob the manifest does not list goes (the other nodes restored long ago)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sync_once(settled=True)
        listed = {e.sha256 for e in self._synced.values()}
        for name in self.objects.names("blobs"):
            if name not in listed:
                self.objects.delete(f"blobs/{name}")


def local_folder(env: Mapping[str, str]) -> Path:
    """A fresh local folder for ``$GPUJOBS_CHECKPOINT_DIR`` (on the image's checkpoint volume)."""
    base = env.get("GPUJOBS_LOCAL_CHECKPOINT_DIR", "") or tempfile.gettempdir()
    Path(base).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="checkpoint-dir-", dir=base))
