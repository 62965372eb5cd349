"""Checkpoint layout and the pure rules about it: naming, the commit marker, whether a checkpoint
is ours, what to resume from and what may be purged.

A checkpoint is the folder ``step-NNNNNNNN/`` (eight digits, so names sort like numbers) holding
the DCP shards ``__<rank>_<n>.distcp``, DCP's ``.metadata``, one ``rng-rank-NNNNN.json`` per rank
and, written last by rank 0 once every rank has finished, ``COMMIT.json``. A folder without
``COMMIT.json`` is a save that was cut short: it is never resumed from.

The marker records the job and attempt that wrote the step and the size and digest (BLAKE3; SHA-256
in markers written before) of every file in it, and, when the job has a checkpoint key, is signed
with it (`signing`). A resume trusts a step only when the marker is signed with this job's key (when
it has one), names this job, lists only the file names above (no separators, nothing outside the
folder, locally or as S3 keys) and every listed file is there with its size and digest, and nothing
else is: anything else was planted, tampered with, torn, or is another job's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpujobs_trainer.digests import ALGORITHMS, DEFAULT_ALGORITHM, is_digest
from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.signing import checkpoint_signature, signature_problem

COMMIT_FILE = "COMMIT.json"
DCP_METADATA_FILE = ".metadata"
Reason = Literal["periodic", "preempted", "on-demand", "final"]
REASONS: tuple[Reason, ...] = ("periodic", "preempted", "on-demand", "final")
_STEP_DIR = re.compile(r"^step-(\d{8})$")
_SHARD_FILE = re.compile(r"__\d+_\d+\.distcp")
_RNG_FILE = re.compile(r"rng-rank-\d{5,}\.json")
SIGNED_KIND = "commit"


def step_dir_name(step: int) -> str:
    """``step-00000042`` for step 42."""
    if step < 0 or step > 99_999_999:
        raise ValueError(f"step {step} does not fit the 8-digit checkpoint layout")
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    """The step of a checkpoint folder name, or None for anything else."""
    match = _STEP_DIR.match(name.rstrip("/"))
    return int(match.group(1)) if match else None


def rng_file_name(rank: int) -> str:
    return f"rng-rank-{rank:05d}.json"


def is_shard_file(name: str) -> bool:
    """A DCP shard name, ``__<rank>_<n>.distcp``: the only files DCP's metadata may point into."""
    return _SHARD_FILE.fullmatch(name) is not None


def is_checkpoint_file(name: str) -> bool:
    """A name a step folder may hold (besides COMMIT.json): a shard, DCP's metadata, an RNG file."""
    return name == DCP_METADATA_FILE or is_shard_file(name) or _RNG_FILE.fullmatch(name) is not None


def is_rank_file(name: str, rank: int) -> bool:
    """Files one rank writes (and, on S3, uploads) itself: its DCP shards and its RNG states."""
    return name.startswith(f"__{rank}_") or name == rng_file_name(rank)


@dataclass(frozen=True, kw_only=True)
class CommitMarker:
    """Contents of COMMIT.json: proof that every rank finished writing this step."""

    step: int
    world_size: int
    torch_version: str
    reason: Reason
    files: Mapping[str, int]  # file name -> size in bytes
    time: str
    digests: Mapping[str, str] = field(default_factory=dict)  # file name -> digest, hex
    position: Mapping[str, int] = field(default_factory=dict)  # data position, e.g. epoch/offset
    job_id: str = ""
    attempt: int = 0
    digest_algorithm: str = DEFAULT_ALGORITHM
    """What ``digests`` are: blake3, or sha256 in markers written before BLAKE3."""
    signature: str = ""
    """HMAC-SHA256 of `payload` under the job's checkpoint key ("" when written without one)."""

    def payload(self) -> dict[str, Any]:
        """Everything the marker says but its signature: what is written, and what is signed."""
        return {
            "step": self.step,
            "world_size": self.world_size,
            "torch_version": self.torch_version,
            "reason": self.reason,
            "files": [
                {"name": n, "size": s, self.digest_algorithm: self.digests.get(n, "")}
                for n, s in sorted(self.files.items())
            ],
            "time": self.time,
            "position": dict(self.position),
            "job_id": self.job_id,
            "attempt": self.attempt,
        }

    def signed(self, key: bytes) -> CommitMarker:
        """This marker signed with ``key`` (unchanged without one)."""
        if not key:
            return self
        return dataclasses.replace(self, signature=checkpoint_signature(key, SIGNED_KIND, self.payload()))

    def signature_problem(self, key: bytes) -> str:
        """Why the marker is not signed with ``key`` ('' when it is, or without a key)."""
        return signature_problem(key, SIGNED_KIND, {**self.payload(), "signature": self.signature})

    def to_json(self) -> str:
        written = self.payload()
        if self.signature:
            written["signature"] = self.signature
        return json.dumps(written, indent=2)

    @classmethod
    def from_json(cls, text: str) -> CommitMarker:
        try:
            raw: dict[str, Any] = json.loads(text)
            reason = raw["reason"]
            if reason not in REASONS:
                raise ValueError(f"unknown reason {reason!r}")
            algorithms = {a for f in raw["files"] for a in ALGORITHMS if a in f} or {DEFAULT_ALGORITHM}
            if len(algorithms) > 1:
                raise ValueError(f"mixes digest algorithms {sorted(algorithms)}")
            (algorithm,) = algorithms
            entries = [(str(f["name"]), int(f["size"]), str(f.get(algorithm, ""))) for f in raw["files"]]
            strays = [name for name, _, _ in entries if not is_checkpoint_file(name)]
            if strays:
                raise ValueError(f"lists files a checkpoint never holds: {', '.join(map(repr, strays))}")
            return cls(
                step=int(raw["step"]),
                world_size=int(raw["world_size"]),
                torch_version=str(raw["torch_version"]),
                reason=reason,
                files={name: size for name, size, _ in entries},
                time=str(raw["time"]),
                digests={name: digest for name, _, digest in entries if digest},
                position={str(k): int(v) for k, v in dict(raw.get("position", {})).items()},
                job_id=str(raw.get("job_id", "")),
                attempt=int(raw.get("attempt", 0)),
                digest_algorithm=algorithm,
                signature=str(raw.get("signature", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{COMMIT_FILE} is malformed: {exc}") from exc


def size_mismatches(marker: CommitMarker, actual: Mapping[str, int]) -> list[str]:
    """Files the marker lists that are missing or have another size (empty list = intact)."""
    problems = []
    for name, size in sorted(marker.files.items()):
        if name not in actual:
            problems.append(f"{name} is missing")
        elif actual[name] != size:
            problems.append(f"{name} has {actual[name]} bytes, expected {size}")
    return problems


def provenance_problems(marker: CommitMarker, *, step: int, job_id: str, key: bytes = b"") -> list[str]:
    """Why a marker found in folder ``step`` does not vouch for a checkpoint of job ``job_id``
    (empty list = it does; the files themselves are checked against it separately). With the
    job's checkpoint ``key``, the marker must be signed with it."""
    problems = []
    unsigned = marker.signature_problem(key)
    if unsigned:
        problems.append(f"its commit marker: {unsigned}")
    if marker.job_id != job_id:
        problems.append(f"its commit marker belongs to job {marker.job_id!r}, not {job_id!r}")
    if marker.step != step:
        problems.append(f"its commit marker is for step {marker.step}")
    if DCP_METADATA_FILE not in marker.files:
        problems.append(f"its commit marker does not list {DCP_METADATA_FILE}")
    undigested = [n for n in sorted(marker.files) if not is_digest(marker.digests.get(n, ""))]
    if undigested:
        problems.append(f"its commit marker records no digest for {', '.join(undigested)}")
    return problems


def unlisted_files(marker: CommitMarker, present: Iterable[str]) -> list[str]:
    """Files in the folder (besides COMMIT.json) that the marker does not list: planted or stray."""
    return [f"{name} is not listed in its commit marker" for name in sorted(set(present) - set(marker.files))]


def digest_mismatches(marker: CommitMarker, actual: Mapping[str, str]) -> list[str]:
    """Listed files whose digest (``actual``: name -> hex digest, of the marker's algorithm) differs."""
    return [
        f"{name} does not match its {marker.digest_algorithm} digest"
        for name in sorted(marker.files)
        if actual.get(name) != marker.digests.get(name)
    ]


@dataclass(frozen=True)
class StepListing:
    """What a checkpoint location holds: committed steps and folders cut short."""

    committed: tuple[int, ...]
    uncommitted: tuple[int, ...]

    @classmethod
    def of(cls, steps_with_commit: Mapping[int, bool]) -> StepListing:
        return cls(
            committed=tuple(sorted(s for s, ok in steps_with_commit.items() if ok)),
            uncommitted=tuple(sorted(s for s, ok in steps_with_commit.items() if not ok)),
        )


def resume_candidates(listing: StepListing) -> list[int]:
    """Committed steps, newest first: resume tries them in this order. Torn folders never appear."""
    return sorted(listing.committed, reverse=True)


def steps_to_purge(listing: StepListing, *, keep: int, in_flight: Iterable[int] = ()) -> list[int]:
    """Folders that may be deleted now.

    The newest ``keep`` (at least two) committed checkpoints stay: the newest could turn out to be
    unreadable and the previous one is the fallback. Torn folders older than the newest commit are
    leftovers of interrupted saves and go too; anything newer may still be in flight.
    """
    keep = max(2, keep)
    committed = sorted(listing.committed, reverse=True)
    if not committed:
        return []
    newest = committed[0]
    busy = set(in_flight)
    old_commits = committed[keep:]
    torn = [s for s in listing.uncommitted if s < newest]
    return sorted(s for s in [*old_commits, *torn] if s not in busy)
