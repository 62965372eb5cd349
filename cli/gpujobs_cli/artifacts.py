"""`gpujobs artifacts` and `gpujobs download`: what a job left in `s3://<bucket>/outputs/<team>/<job-id>/`.

The bootstrap uploads each node's output folder there (docs/cli.md has the layout); these commands
only read it, with the user's own credentials, which IAM may limit to one team's `outputs/<team>/`
(docs/security.md, "What a team's users can read"). The team comes from the job's record. A job
whose attempts a release before teams were in the names ran left its outputs in `outputs/<job-id>/`:
when the team's prefix holds nothing, that one is read instead (and counts as empty when the
user's policy does not reach it). A key is written by the job, so it is treated as
hostile: shown through `printable`, and downloaded only when it names a plain relative path that
stays inside the target folder (no `..`, no absolute path, no symlink already in the folder leading
out). A download writes nothing when it would overwrite a file, unless `--force`; an unsafe key is
skipped with a warning and makes the command exit 1.

Keys a filesystem cannot hold are skipped the same way, each named with why, and the rest still
downloaded: a path component over `NAME_MAX` bytes (S3 allows 1024-byte keys with no limit per
component), a key that is also the folder of another (`a` and `a/b`: S3 has no folders, a disk
cannot hold both), and whatever else the disk refuses for one file (a file in the way of a folder).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.contract import outputs_prefix
from gpujobs.domain.spec_errors import printable
from gpujobs.service.ports import JobNotFoundError
from gpujobs_cli.commands import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, CommandError
from gpujobs_cli.render import table, when
from gpujobs_cli.resources import BUCKET, TABLE, Resources, discover


@dataclass(frozen=True)
class Artifact:
    """One object of a job's outputs; `key` is relative to the job's outputs prefix."""

    key: str
    size: int
    modified: datetime


def list_artifacts(s3: Any, *, bucket: str, prefix: str) -> list[Artifact]:
    """Every object under a job's outputs `prefix`, by key."""
    found = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            found.append(Artifact(obj["Key"][len(prefix) :], int(obj["Size"]), obj["LastModified"].astimezone(UTC)))
    return sorted(found, key=lambda a: a.key)


def safe_target(root: Path, key: str) -> Path | None:
    """Where `key` goes under `root`, or None when it could land anywhere else."""
    parts = PurePosixPath(key).parts
    if not parts or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in key.split("/")):
        return None
    if any(not c.isprintable() for c in key):
        return None
    target = root.joinpath(*parts)
    return target if target.resolve().is_relative_to(root.resolve()) else None


NAME_MAX = 255
"""Bytes in one path component on ext4, xfs, btrfs and APFS (NTFS: 255 UTF-16 units)."""


def unwritable(key: str, keys: frozenset[str]) -> str | None:
    """Why `key` (a safe one) cannot be a file on disk beside the other `keys`, or None."""
    for part in key.split("/"):
        if len(part.encode()) > NAME_MAX:
            return f"a path component of {len(part.encode())} bytes, more than a file name may have ({NAME_MAX})"
    if key in _folders(keys):
        inside = min(k for k in keys if k.startswith(key + "/"))
        return f"it is also the folder of '{printable(inside)}': a disk cannot hold both"
    return None


@functools.cache
def _folders(keys: frozenset[str]) -> frozenset[str]:
    """Every folder the keys need (`a/b/c` needs `a` and `a/b`), once per download."""
    return frozenset(key[:i] for key in keys for i, c in enumerate(key) if c == "/")


def human_size(size: int) -> str:
    """`512 B`, `2.9 KiB`, `412.0 MiB`, ... (binary units, one decimal)."""
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"


# ---- the commands ---------------------------------------------------------------------------
def cmd_artifacts(args: argparse.Namespace) -> int:
    resources = discover(stack=args.stack, region=args.region, needs=(BUCKET, TABLE))
    prefix, artifacts = artifacts_of(resources, args.job_id)
    where = f"s3://{resources.values[BUCKET]}/{prefix}"
    if args.json:
        print(json.dumps([_as_json(a, where) for a in artifacts], indent=2))
        return EXIT_OK
    if not artifacts:
        return EXIT_OK
    rows = [[printable(a.key), human_size(a.size), when(a.modified)] for a in artifacts]
    print(table(["KEY", "SIZE", "MODIFIED"], rows))
    total = human_size(sum(a.size for a in artifacts))
    print(f"{len(artifacts)} file(s), {total}, in {printable(where)}", file=sys.stderr)
    return EXIT_OK


def cmd_download(args: argparse.Namespace) -> int:
    resources = discover(stack=args.stack, region=args.region, needs=(BUCKET, TABLE))
    prefix, artifacts = artifacts_of(resources, args.job_id)
    if not artifacts:
        return EXIT_FAILED
    root = Path(args.dir if args.dir is not None else args.job_id)
    planned: list[tuple[Artifact, Path]] = []
    refused = 0
    keys = frozenset(a.key for a in artifacts)
    for artifact in artifacts:
        target = safe_target(root, artifact.key)
        why = f"not a path inside {root}" if target is None else unwritable(artifact.key, keys)
        if target is None or why is not None:
            refused += 1
            _skipping(artifact, why)
        else:
            planned.append((artifact, target))
    existing = [str(target) for _, target in planned if target.exists() or target.is_symlink()]
    if existing and not args.force:
        shown = ", ".join(printable(p) for p in existing[:5]) + (" ..." if len(existing) > 5 else "")
        raise CommandError(f"{len(existing)} file(s) already exist ({shown}); pass --force to overwrite them")
    s3, bucket = resources.client("s3"), resources.values[BUCKET]
    downloaded = 0
    for number, (artifact, target) in enumerate(planned, start=1):
        print(f"[{number}/{len(planned)}] {printable(artifact.key)} ({human_size(artifact.size)})", file=sys.stderr)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink():
                target.unlink()  # --force replaces the link, never writes through it
            s3.download_file(bucket, prefix + artifact.key, str(target))
        except OSError as exc:  # this file only: a file where a folder must be, a name the disk refuses
            refused += 1
            _skipping(artifact, f"the disk refused it ({exc.strerror or exc})")
        else:
            downloaded += 1
    print(f"downloaded {downloaded} file(s) to {printable(str(root))}", file=sys.stderr)
    if refused:
        print(f"gpujobs: skipped {refused} key(s); see above", file=sys.stderr)
    return EXIT_FAILED if refused else EXIT_OK


def _skipping(artifact: Artifact, why: str | None) -> None:
    print(f"gpujobs: skipping '{printable(artifact.key)}': {why}", file=sys.stderr)


# ---- helpers ---------------------------------------------------------------------------------
def artifacts_of(resources: Resources, job_id: str, *, quiet: bool = False) -> tuple[str, list[Artifact]]:
    """The job's outputs prefix and what is under it. No job: exit 3; none yet: said on stderr
    (unless `quiet`: the caller says what it missed)."""
    store = DynamoJobStore(table_name=resources.table_name, client=resources.client("dynamodb"))
    try:
        job = store.get(job_id)
    except JobNotFoundError:
        raise CommandError(f"no job {job_id}", EXIT_NOT_FOUND) from None
    s3, bucket = resources.client("s3"), resources.values[BUCKET]
    prefix = outputs_prefix(job.job_id, team=job.team)
    artifacts = list_artifacts(s3, bucket=bucket, prefix=prefix)
    if artifacts:
        return prefix, artifacts
    before_teams = outputs_prefix(job.job_id, team=None)
    artifacts = _listed_if_allowed(s3, bucket=bucket, prefix=before_teams)
    if artifacts:
        return before_teams, artifacts
    if quiet:
        return prefix, []
    print(
        f"{job_id} ({job.state.value}) has no outputs yet: its output folder is uploaded when it ends "
        "and whenever it asks for it (docs/training.md)",
        file=sys.stderr,
    )
    return prefix, []


def _listed_if_allowed(s3: Any, *, bucket: str, prefix: str) -> list[Artifact]:
    """`list_artifacts`, or none when the user's policy does not reach `prefix` (a team-scoped
    user and the outputs of a job from before teams were in the names)."""
    from botocore.exceptions import ClientError

    try:
        return list_artifacts(s3, bucket=bucket, prefix=prefix)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "AccessDenied":
            raise
        return []


def _as_json(artifact: Artifact, where: str) -> dict[str, Any]:
    return {
        "key": artifact.key,
        "size": artifact.size,
        "modified": artifact.modified.isoformat(),
        "uri": where + artifact.key,
    }
