"""A synced folder's manifest: which bytes make up one complete sync, signed with the job's key.

Each sync of a ``checkpoint: directory`` folder writes one immutable manifest,
``manifests/<attempt>-<sequence>.json`` (six and eight digits, so names sort like numbers), after
the blobs it lists. It names the job and the attempt that wrote it, a sequence that only grows
(a replacement continues its predecessor's), the time, and for every file its relative path, size
and BLAKE3 digest (``blobs/<digest>`` holds those bytes). With the job's checkpoint key it is
signed (`signing.checkpoint_signature`), so a manifest another job planted, or one copied from
another job, is never restored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from gpujobs_trainer.digests import DEFAULT_ALGORITHM, is_digest
from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.signing import checkpoint_signature, signature_problem

MANIFESTS, BLOBS, CLAIMS = "manifests", "blobs", "claims"
MANIFEST_VERSION = 2
SIGNED_KIND = "manifest"
_NAME = re.compile(r"^(\d{6})-(\d{8})\.json$")


@dataclass(frozen=True)
class Entry:
    digest: str
    size: int


def manifest_name(attempt: int, sequence: int) -> str:
    return f"{attempt:06d}-{sequence:08d}.json"


def parse_manifest_name(name: str) -> tuple[int, int] | None:
    """(attempt, sequence) of a manifest's file name, or None for anything else."""
    match = _NAME.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def newest_first(names: list[str]) -> list[tuple[int, int, str]]:
    """The manifests among ``names``, newest first: a later attempt's before an earlier one's
    (an attempt that was replaced may still sync, but its line of history was left behind)."""
    found = [(*parsed, name) for name in names if (parsed := parse_manifest_name(name)) is not None]
    return sorted(found, reverse=True)


def safe_relative(name: str) -> PurePosixPath:
    """``name`` as a path inside the folder, or CheckpointError (absolute, ``..``, empty parts)."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or any(part in ("", ".", "..") for part in name.split("/")):
        raise CheckpointError(f"the manifest lists {name[:120]!r}, which is not a path inside the folder")
    return path


@dataclass(frozen=True, kw_only=True)
class Manifest:
    job_id: str
    attempt: int
    sequence: int
    time: str
    files: Mapping[str, Entry] = field(default_factory=dict)
    signature: str = ""

    @property
    def name(self) -> str:
        return manifest_name(self.attempt, self.sequence)

    @property
    def digests(self) -> frozenset[str]:
        return frozenset(e.digest for e in self.files.values())

    def payload(self) -> dict[str, Any]:
        """What is written and signed (the signature aside), rebuilt from the parsed values."""
        return {
            "version": MANIFEST_VERSION,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "sequence": self.sequence,
            "time": self.time,
            "digest": DEFAULT_ALGORITHM,
            "files": {n: {"digest": e.digest, "size": e.size} for n, e in sorted(self.files.items())},
        }

    def to_bytes(self, key: bytes) -> bytes:
        """The manifest as written: signed when there is a key."""
        payload = self.payload()
        if key:
            payload["signature"] = checkpoint_signature(key, SIGNED_KIND, payload)
        return json.dumps(payload, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and check the form (CheckpointError when malformed or naming paths outside the folder)."""
        try:
            raw = json.loads(data)
            if raw["version"] != MANIFEST_VERSION or raw.get("digest") != DEFAULT_ALGORITHM:
                raise ValueError(f"version {raw['version']!r}, digest {raw.get('digest')!r}")
            files = {str(n): Entry(str(e["digest"]), int(e["size"])) for n, e in dict(raw["files"]).items()}
            manifest = cls(
                job_id=str(raw["job_id"]),
                attempt=int(raw["attempt"]),
                sequence=int(raw["sequence"]),
                time=str(raw["time"]),
                files=files,
                signature=str(raw.get("signature", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"the manifest is malformed: {exc}") from exc
        for name, entry in files.items():
            safe_relative(name)
            if not is_digest(entry.digest) or entry.size < 0:
                raise CheckpointError(f"the manifest's entry {name!r} has no valid digest and size")
        return manifest


def manifest_problem(manifest: Manifest, *, name: str, job_id: str, key: bytes) -> str:
    """Why ``manifest`` (read from ``name``) is not one this job may restore ('' when it is)."""
    if manifest.name != name:
        return f"it says it is {manifest.name}"
    if manifest.job_id != job_id:
        return f"it belongs to job {manifest.job_id!r}, not {job_id!r}"
    return signature_problem(key, SIGNED_KIND, {**manifest.payload(), "signature": manifest.signature})
