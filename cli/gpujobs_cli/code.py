"""`code:` in a spec file: a local folder that `gpujobs submit` packs and uploads before sending.

The archive is a deterministic .tar.gz (sorted names, zero times, no owners), so the same folder
gives the same bytes and the same SHA-256: a resubmission with the same client_token sends the same
spec and stays idempotent. It holds regular files and folders only, at relative paths: a link to a
file inside the folder is stored as that file; a link that leads out of the folder, or to a folder,
is refused (the launcher refuses links in an archive anyway, gpujobs_trainer.code_archive). Names
matching `DEFAULT_EXCLUDES` or a line of the folder's `.gpujobsignore` (fnmatch patterns matched
against the relative path and the name, `#` comments) are left out. Packed, it may not exceed
`MAX_CODE_BYTES`: code travels this way, data belongs in the team's buckets.

It is uploaded to `s3://<stack bucket>/jobs/<job id>/code/<sha256>.tar.gz`, under the job's own
prefix, which the job's session policy already lets the container read; the spec that is sent names
that URI and its digest.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from gpujobs.domain.job_access import job_prefix

MAX_CODE_BYTES = 100 * 1024 * 1024
IGNORE_FILE = ".gpujobsignore"
DEFAULT_EXCLUDES = (".git", "__pycache__", "*.pyc", ".venv", ".mypy_cache", ".pytest_cache", IGNORE_FILE)
LAUNCHER_MODULE = "gpujobs_trainer.launch"


class CodePackError(Exception):
    """The folder cannot be packed as the job's code; the message names the path and why."""


@dataclass(frozen=True)
class PackedCode:
    data: bytes
    sha256: str
    files: int
    names: frozenset[str] = frozenset()
    """The regular files packed, as relative POSIX paths (what the spec's `requirements:` may name)."""


def _excluded(relative: PurePosixPath, patterns: tuple[str, ...]) -> bool:
    text = relative.as_posix()
    return any(fnmatch.fnmatch(text, p) or fnmatch.fnmatch(relative.name, p) for p in patterns)


def _patterns(folder: Path) -> tuple[str, ...]:
    ignore = folder / IGNORE_FILE
    lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.is_file() else []
    own = tuple(line.strip().rstrip("/") for line in lines if line.strip() and not line.lstrip().startswith("#"))
    return DEFAULT_EXCLUDES + own


def _entries(folder: Path) -> list[tuple[PurePosixPath, Path]]:
    """(name in the archive, file to read) for every folder and file to pack, sorted."""
    root = folder.resolve()
    patterns = _patterns(folder)
    found: list[tuple[PurePosixPath, Path]] = []
    for current, dirs, files in os.walk(folder):
        base = Path(current)
        for name in sorted(dirs):
            path = base / name
            relative = PurePosixPath(path.relative_to(folder).as_posix())
            if _excluded(relative, patterns):
                dirs.remove(name)
            elif path.is_symlink():
                raise CodePackError(f"{relative} is a link to a folder: links are not packed (copy it in)")
            else:
                found.append((relative, path))
        for name in sorted(files):
            path = base / name
            relative = PurePosixPath(path.relative_to(folder).as_posix())
            if _excluded(relative, patterns):
                continue
            target = path.resolve()
            if not target.is_relative_to(root):
                raise CodePackError(f"{relative} links out of the code folder (to {target})")
            if not target.is_file():
                raise CodePackError(f"{relative} is not a regular file")
            found.append((relative, target))
    return sorted(found)


def pack(folder: Path) -> PackedCode:
    """The folder as a deterministic .tar.gz, or CodePackError."""
    if not folder.is_dir():
        raise CodePackError(f"code: {folder} is not a folder")
    raw = io.BytesIO()
    files = 0
    names = set()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relative, path in _entries(folder):
            info = tarfile.TarInfo(relative.as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            info.size, info.mode = path.stat().st_size, 0o755 if os.access(path, os.X_OK) else 0o644
            with open(path, "rb") as handle:
                tar.addfile(info, handle)
            files += 1
            names.add(relative.as_posix())
            if raw.tell() > MAX_CODE_BYTES:
                raise CodePackError(f"code: {folder} is over {MAX_CODE_BYTES // 2**20} MiB; put data in a bucket")
    data = gzip.compress(raw.getvalue(), mtime=0)
    if len(data) > MAX_CODE_BYTES:
        raise CodePackError(f"code: {folder} packs to {len(data)} bytes, over {MAX_CODE_BYTES // 2**20} MiB")
    return PackedCode(data=data, sha256=hashlib.sha256(data).hexdigest(), files=files, names=frozenset(names))


def code_key(job_id: str, sha256: str) -> str:
    """Where the archive goes: under the job's own prefix, which its session may read."""
    return f"{job_prefix(job_id)}code/{sha256}.tar.gz"


def upload(packed: PackedCode, *, s3: Any, bucket: str, job_id: str) -> str:
    """Put the archive under the job's prefix (idempotent: the key is its digest); its s3:// URI."""
    key = code_key(job_id, packed.sha256)
    s3.put_object(Bucket=bucket, Key=key, Body=packed.data)
    return f"s3://{bucket}/{key}"


def entrypoint_warning(image: str, *, needs_launcher: bool) -> str | None:
    """What a local docker knows of `image`'s entrypoint, when the job needs our launcher there.

    Only checkable offline when docker is installed and the image is already pulled or built;
    otherwise nothing is said (docs/job-spec.md lists what is checked where).
    """
    docker = shutil.which("docker")
    if not needs_launcher or docker is None:
        return None
    found = subprocess.run(
        [docker, "image", "inspect", "--format", "{{json .Config.Entrypoint}}", image],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if found.returncode != 0 or LAUNCHER_MODULE in found.stdout:
        return None
    return (
        f"image {image}'s entrypoint is {found.stdout.strip()}, not `python -m {LAUNCHER_MODULE} --`: "
        "`checkpoint: gpujobs|directory` and `code:` need an image built FROM the training image"
    )
