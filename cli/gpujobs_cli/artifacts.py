"""`gpujobs artifacts` and `gpujobs download`: what a job left in `s3://<bucket>/outputs/<job-id>/`.

The bootstrap uploads each node's output folder there (docs/cli.md has the layout); these commands
only read it, with the user's own credentials. A key is written by the job, so it is treated as
hostile: shown through `printable`, and downloaded only when it names a plain relative path that
stays inside the target folder (no `..`, no absolute path, no symlink already in the folder leading
out). A download writes nothing when it would overwrite a file, unless `--force`; an unsafe key is
skipped with a warning and makes the command exit 1.
"""

from __future__ import annotations

import argparse
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


def list_artifacts(s3: Any, *, bucket: str, job_id: str) -> list[Artifact]:
    """Every object under the job's outputs prefix, by key."""
    prefix = outputs_prefix(job_id)
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
    resources = discover(stack=args.stack, region=args.region, needs=(BUCKET,))
    artifacts = _artifacts_of(resources, args.job_id)
    where = f"s3://{resources.values[BUCKET]}/{outputs_prefix(args.job_id)}"
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
    resources = discover(stack=args.stack, region=args.region, needs=(BUCKET,))
    artifacts = _artifacts_of(resources, args.job_id)
    if not artifacts:
        return EXIT_FAILED
    root = Path(args.dir if args.dir is not None else args.job_id)
    planned: list[tuple[Artifact, Path]] = []
    refused = 0
    for artifact in artifacts:
        target = safe_target(root, artifact.key)
        if target is None:
            refused += 1
            print(f"gpujobs: skipping {printable(artifact.key)!r}: not a path inside {root}", file=sys.stderr)
        else:
            planned.append((artifact, target))
    existing = [str(target) for _, target in planned if target.exists() or target.is_symlink()]
    if existing and not args.force:
        shown = ", ".join(printable(p) for p in existing[:5]) + (" ..." if len(existing) > 5 else "")
        raise CommandError(f"{len(existing)} file(s) already exist ({shown}); pass --force to overwrite them")
    s3, bucket, prefix = resources.client("s3"), resources.values[BUCKET], outputs_prefix(args.job_id)
    for number, (artifact, target) in enumerate(planned, start=1):
        print(f"[{number}/{len(planned)}] {printable(artifact.key)} ({human_size(artifact.size)})", file=sys.stderr)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()  # --force replaces the link, never writes through it
        s3.download_file(bucket, prefix + artifact.key, str(target))
    print(f"downloaded {len(planned)} file(s) to {printable(str(root))}", file=sys.stderr)
    return EXIT_FAILED if refused else EXIT_OK


# ---- helpers ---------------------------------------------------------------------------------
def _artifacts_of(resources: Resources, job_id: str) -> list[Artifact]:
    """The job's outputs. None at all: a job that has none yet (said on stderr) or no job (exit 3)."""
    artifacts = list_artifacts(resources.client("s3"), bucket=resources.values[BUCKET], job_id=job_id)
    if artifacts:
        return artifacts
    with_table = discover(stack=resources.stack, region=resources.region, needs=(BUCKET, TABLE))
    store = DynamoJobStore(table_name=with_table.table_name, client=with_table.client("dynamodb"))
    try:
        job = store.get(job_id)
    except JobNotFoundError:
        raise CommandError(f"no job {job_id}", EXIT_NOT_FOUND) from None
    print(
        f"{job_id} ({job.state.value}) has no outputs yet: its output folder is uploaded when it ends "
        "and whenever it asks for it (docs/training.md)",
        file=sys.stderr,
    )
    return []


def _as_json(artifact: Artifact, where: str) -> dict[str, Any]:
    return {
        "key": artifact.key,
        "size": artifact.size,
        "modified": artifact.modified.isoformat(),
        "uri": where + artifact.key,
    }
