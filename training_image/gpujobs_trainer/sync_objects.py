"""Where a ``checkpoint: directory`` folder's copy lives: keys under ``<GPUJOBS_CHECKPOINT_URI>/dir/``.

S3 in production (boto3 honours AWS_ENDPOINT_URL: moto, the local cloud), a local folder in tests
and for a local checkpoint URI. `directory_sync` decides what to write there; this module only
moves bytes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from gpujobs_trainer.errors import CheckpointError

SYNC_SUBFOLDER = "dir"


class Objects(Protocol):
    """The folder's copy: named objects, written whole."""

    where: str

    def read(self, key: str) -> bytes | None: ...
    def upload(self, path: Path, key: str) -> None: ...
    def write(self, key: str, data: bytes) -> None: ...
    def download(self, key: str, path: Path) -> None: ...
    def delete(self, key: str) -> None: ...
    def names(self, folder: str) -> list[str]: ...


class S3Objects:
    """Keys under ``s3://bucket/prefix/``; botocore's adaptive retries take throttling and 5xx errors."""

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
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(path, staged)
        staged.replace(target)

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
        return sorted(p.name for p in base.iterdir() if not p.name.startswith(".")) if base.is_dir() else []


def objects_for(checkpoint_uri: str) -> Objects:
    """The copy's location: ``dir/`` under the job's checkpoint URI (s3://, file:// or a path)."""
    parsed = urlparse(checkpoint_uri)
    if parsed.scheme == "s3" and parsed.netloc:
        return S3Objects(parsed.netloc, f"{parsed.path.strip('/')}/{SYNC_SUBFOLDER}".lstrip("/"))
    if parsed.scheme in ("", "file"):
        return LocalObjects(Path(parsed.path) / SYNC_SUBFOLDER)
    raise CheckpointError(f"checkpoint URI {checkpoint_uri!r}: unsupported for checkpoint: directory")
