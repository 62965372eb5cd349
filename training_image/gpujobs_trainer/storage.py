"""Where checkpoints live: a local (or shared) directory, or S3 with a local staging directory.

DCP always reads and writes a local folder; for S3 that folder is a staging copy. Each rank
uploads the files it wrote itself, rank 0 uploads DCP's ``.metadata`` and finally ``COMMIT.json``,
so on S3 as on disk the marker appears only after every other object of the step exists.

`fetch` hands a step to DCP only once the local folder holds exactly the files its marker lists,
each with the recorded size and digest (`verify_folder`): sizes first (a stat), digests after (a
read of every byte; BLAKE3, or SHA-256 for markers written before it).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from gpujobs_trainer.digests import DEFAULT_ALGORITHM, bytes_digest, file_digest
from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.layout import (
    COMMIT_FILE,
    CommitMarker,
    StepListing,
    digest_mismatches,
    parse_step_dir,
    size_mismatches,
    step_dir_name,
    unlisted_files,
)

log = logging.getLogger("gpujobs_trainer")

MULTIPART_THRESHOLD = 64 * 1024 * 1024
UPLOAD_ATTEMPTS = 4


class CheckpointStore(Protocol):
    """A checkpoint location. Implementations: LocalStore, S3Store."""

    uri: str

    def check_reachable(self) -> None: ...
    def listing(self) -> StepListing: ...
    def read_commit(self, step: int) -> CommitMarker: ...
    def staging_dir(self, step: int) -> Path: ...
    def publish(self, step: int, names: list[str]) -> None: ...
    def write_commit(self, marker: CommitMarker) -> None: ...
    def fetch(self, step: int, marker: CommitMarker) -> Path: ...
    def delete(self, step: int) -> None: ...
    def step_uri(self, step: int) -> str: ...


def open_store(uri: str, *, local_dir: str) -> CheckpointStore:
    """The store for GPUJOBS_CHECKPOINT_URI."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise CheckpointError(f"checkpoint URI {uri!r} names no bucket")
        return S3Store(uri=uri, bucket=parsed.netloc, prefix=parsed.path.strip("/"), local_dir=local_dir)
    if parsed.scheme == "file":
        return LocalStore(Path(parsed.path))
    if parsed.scheme == "":
        return LocalStore(Path(uri))
    raise CheckpointError(f"checkpoint URI {uri!r}: unsupported scheme {parsed.scheme!r} (use s3:// or a path)")


def local_sizes(folder: Path) -> dict[str, int]:
    if not folder.is_dir():
        return {}
    return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}


def verify_folder(folder: Path, marker: CommitMarker, *, where: str) -> None:
    """Raise CheckpointError unless ``folder`` holds exactly the files ``marker`` lists (besides
    COMMIT.json), each with its recorded size and digest."""
    present = local_sizes(folder)
    present.pop(COMMIT_FILE, None)
    problems = size_mismatches(marker, present)
    if problems:
        raise CheckpointError(f"checkpoint {where} is incomplete: {'; '.join(problems)}")
    problems = unlisted_files(marker, present) or digest_mismatches(
        marker, {name: file_digest(folder / name, marker.digest_algorithm) for name in marker.files}
    )
    if problems:
        raise CheckpointError(f"checkpoint {where} is not what its commit marker records: {'; '.join(problems)}")


def write_durably(path: Path, text: str, digest: str = DEFAULT_ALGORITHM) -> str:
    """Write and fsync ``path`` (it is on disk before anything that lists it is committed); return
    the digest (BLAKE3 unless told) of what was written."""
    data = text.encode("utf-8")
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return bytes_digest(data, digest)


def fsync_dir(folder: Path) -> None:
    """Make renames and new entries in ``folder`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """tmp + fsync + rename (+ fsync of the folder): a reader sees the old file or the whole new
    one, never a torn one, and the rename itself survives a power loss."""
    tmp = path.with_name(path.name + ".tmp")
    write_durably(tmp, text)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class LocalStore:
    """Checkpoints directly in a directory: DCP writes into the final place, nothing to upload."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = str(root)

    def check_reachable(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise CheckpointError(f"checkpoint directory {self.root} is not writable: {exc}") from exc

    def listing(self) -> StepListing:
        if not self.root.is_dir():
            return StepListing((), ())
        found: dict[int, bool] = {}
        for child in self.root.iterdir():
            step = parse_step_dir(child.name)
            if step is not None and child.is_dir():
                found[step] = (child / COMMIT_FILE).is_file()
        return StepListing.of(found)

    def read_commit(self, step: int) -> CommitMarker:
        return CommitMarker.from_json((self.staging_dir(step) / COMMIT_FILE).read_text(encoding="utf-8"))

    def staging_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def publish(self, step: int, names: list[str]) -> None:
        """Nothing to upload: the files already are in place."""

    def write_commit(self, marker: CommitMarker) -> None:
        write_atomically(self.staging_dir(marker.step) / COMMIT_FILE, marker.to_json())
        fsync_dir(self.root)  # the step folder's own entry

    def fetch(self, step: int, marker: CommitMarker) -> Path:
        folder = self.staging_dir(step)
        verify_folder(folder, marker, where=str(folder))
        return folder

    def delete(self, step: int) -> None:
        shutil.rmtree(self.staging_dir(step), ignore_errors=True)

    def step_uri(self, step: int) -> str:
        return str(self.staging_dir(step))


class S3Store:
    """Checkpoints under ``s3://bucket/prefix/step-NNNNNNNN/``, staged in a local directory.

    boto3 honours AWS_ENDPOINT_URL by itself, which is how tests point this at moto. Uploads use
    ``upload_file`` with a TransferConfig (multipart above 64 MiB) inside a retry loop on top of
    botocore's own adaptive retries, because a spot notice leaves no time for a manual retry.
    """

    def __init__(self, *, uri: str, bucket: str, prefix: str, local_dir: str) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.uri = uri
        self.bucket = bucket
        self.prefix = prefix
        self.local_root = Path(local_dir)
        self._client: Any = boto3.client(
            "s3",
            config=Config(retries={"max_attempts": 8, "mode": "adaptive"}, connect_timeout=5, read_timeout=60),
        )
        self._transfer = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD, max_concurrency=8
        )

    def _key(self, step: int, name: str = "") -> str:
        parts = [p for p in (self.prefix, step_dir_name(step), name) if p]
        return "/".join(parts)

    def check_reachable(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        except (BotoCoreError, ClientError) as exc:
            raise CheckpointError(f"checkpoint URI {self.uri} is unreachable: {exc}") from exc
        try:
            self.local_root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"local checkpoint staging dir {self.local_root}: {exc}") from exc

    def listing(self) -> StepListing:
        base = f"{self.prefix}/" if self.prefix else ""
        steps: set[int] = set()
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=base, Delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                step = parse_step_dir(common["Prefix"][len(base) :])
                if step is not None:
                    steps.add(step)
        return StepListing.of({step: self._exists(self._key(step, COMMIT_FILE)) for step in steps})

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise
        return True

    def read_commit(self, step: int) -> CommitMarker:
        body = self._client.get_object(Bucket=self.bucket, Key=self._key(step, COMMIT_FILE))["Body"]
        return CommitMarker.from_json(body.read().decode("utf-8"))

    def staging_dir(self, step: int) -> Path:
        return self.local_root / step_dir_name(step)

    def publish(self, step: int, names: list[str]) -> None:
        folder = self.staging_dir(step)
        for name in names:
            self._upload(folder / name, self._key(step, name))

    def _upload(self, path: Path, key: str) -> None:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(1, UPLOAD_ATTEMPTS + 1):
            try:
                self._client.upload_file(str(path), self.bucket, key, Config=self._transfer)
                return
            except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
                if attempt == UPLOAD_ATTEMPTS:
                    raise CheckpointError(f"upload of {path.name} to s3://{self.bucket}/{key} failed: {exc}") from exc
                log.warning("upload of %s failed (attempt %d): %s; retrying", path.name, attempt, exc)
                time.sleep(0.5 * 2**attempt)

    def write_commit(self, marker: CommitMarker) -> None:
        local = self.staging_dir(marker.step) / COMMIT_FILE
        write_atomically(local, marker.to_json())
        self._upload(local, self._key(marker.step, COMMIT_FILE))

    def fetch(self, step: int, marker: CommitMarker) -> Path:
        """Make the step available locally, downloading only files whose local copy differs from
        the marker; the local copy is a cache, so files the marker does not list are dropped."""
        strays = unlisted_files(marker, self._object_names(step))
        if strays:
            raise CheckpointError(
                f"checkpoint {self.step_uri(step)} is not what its commit marker records: {'; '.join(strays)}"
            )
        folder = self.staging_dir(step)
        folder.mkdir(parents=True, exist_ok=True)
        have = local_sizes(folder)
        for name in set(have) - set(marker.files) - {COMMIT_FILE}:
            (folder / name).unlink()
        for name, size in marker.files.items():
            cached = have.get(name) == size and file_digest(
                folder / name, marker.digest_algorithm
            ) == marker.digests.get(name)
            if not cached:
                self._client.download_file(self.bucket, self._key(step, name), str(folder / name))
        verify_folder(folder, marker, where=self.step_uri(step))
        return folder

    def _object_names(self, step: int) -> list[str]:
        """Everything under the step's prefix except COMMIT.json, relative to it (a name with a
        separator is an object no checkpoint holds)."""
        base = self._key(step) + "/"
        paginator = self._client.get_paginator("list_objects_v2")
        names = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=base):
            names += [obj["Key"][len(base) :] for obj in page.get("Contents", [])]
        return [name for name in names if name != COMMIT_FILE]

    def delete(self, step: int) -> None:
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(step) + "/"):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            # COMMIT.json first so a half-deleted step can never look committed.
            keys.sort(key=lambda k: not k["Key"].endswith(COMMIT_FILE))
            for key in keys:
                self._client.delete_object(Bucket=self.bucket, Key=key["Key"])
        shutil.rmtree(self.staging_dir(step), ignore_errors=True)

    def step_uri(self, step: int) -> str:
        return f"s3://{self.bucket}/{self._key(step)}"

    def prune_staging(self, *, keep_step: int) -> None:
        """Drop local staging copies of older steps once ``keep_step`` is committed on S3 (newer
        ones may belong to a save in progress; a later commit drops them)."""
        if not self.local_root.is_dir():
            return
        for child in self.local_root.iterdir():
            step = parse_step_dir(child.name)
            if step is not None and step < keep_step:
                shutil.rmtree(child, ignore_errors=True)
