"""The spec's ``code:``: a .tar.gz fetched from S3 and unpacked into the working directory.

`gpujobs submit` packs a local folder and uploads it under the job's prefix (or the spec names an
archive in S3 the job may read); the launcher unpacks it before the command starts, so a job ships
new code without a new image. The archive is untrusted input: its bytes must have the SHA-256 the
job carries, and an archive without one is refused (the object could be replaced in S3 between
submit and any attempt, by whoever may write that key); `gpujobs submit` computes the digest of a
folder it packs, a spec naming an `s3://` archive must give `code_sha256`. Only regular files and
folders at relative paths inside the working directory are written. Absolute paths, ``..``, links
of either kind, devices and FIFOs refuse the whole archive before anything is written, and so does
an archive that unpacks to more than `MAX_UNPACKED_BYTES`. Files keep their permission bits, less
setuid/setgid/sticky (and group/other write), and are opened with O_NOFOLLOW. Beneath these checks,
each member also passes tarfile's own `data` filter (PEP 706) where this Python has it (3.11.4+,
3.10.12+, 3.9.17+, 3.12+): it refuses a member that a link already in the working directory (the
image's own) would lead outside it; without it, the checks above stand alone.

A refused archive is a configuration error (exit 78): another attempt would fetch the same
bytes. So is an archive that is not there or that the job may not read (NoSuchKey, AccessDenied: a
4xx on the user's own object), and bytes of another digest. A transient S3 failure (SlowDown,
InternalError, RequestTimeout, throttling, a 5xx, a connection that dropped) is not what the user
wrote: botocore retries it first (adaptive mode), then the whole fetch is tried again with backoff
(`FETCH_ATTEMPTS`), and if S3 still fails, `CodeFetchUnavailableError` ends the attempt as a crash,
which the control plane retries, rather than as a configuration error, which fails the job.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from gpujobs_trainer.errors import ConfigError, TrainerError

log = logging.getLogger("gpujobs_trainer.code_archive")

MAX_UNPACKED_BYTES = 2 * 1024**3
_DATA_FILTER = getattr(tarfile, "data_filter", None)
"""PEP 706's `data` filter, absent before Python 3.11.4 / 3.10.12 / 3.9.17."""
MAX_MEMBERS = 100_000
_CHUNK = 1024 * 1024
FETCH_ATTEMPTS = 5
"""Tries of the whole download (each with botocore's own retries inside) before S3 counts as down."""
FETCH_BACKOFF_SECONDS = 2.0
"""The first pause between two tries; it doubles each time (2, 4, 8, 16 s: about half a minute)."""
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "InternalFailure",
        "ExpiredToken",
        "RequestExpired",
        "TokenRefreshRequired",
    }
)
"""S3 error codes that say nothing about the archive the user named: S3 busy or failing, or the
instance role's own session expiring (its credentials are refreshed for the next try)."""


class CodeArchiveError(ConfigError):
    """The code archive is not there, may not be read, is not the one the job names, or is unsafe
    to unpack: what the user wrote, so another attempt would fail the same way."""


class CodeFetchUnavailableError(TrainerError):
    """S3 kept failing transiently while the archive was fetched: not a configuration error."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (from boto3/botocore/s3transfer) is S3 or the network failing, not the request:
    a throttling or 5xx error, a timeout, a dropped connection, retries exhausted on a read."""
    from boto3.exceptions import RetriesExceededError
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return str(error.get("Code", "")) in TRANSIENT_CODES or status >= 500 or status in (408, 429)
    return isinstance(exc, (BotoCoreError, RetriesExceededError, ConnectionError, TimeoutError))


def _is_client_error(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError)


def s3_client() -> Any:
    """An S3 client whose own retries take throttling and 5xx errors (adaptive mode)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"max_attempts": 10, "mode": "adaptive"}))


def fetch(
    uri: str,
    expected_sha256: str,
    into: Path,
    *,
    s3: Any = None,
    attempts: int = FETCH_ATTEMPTS,
    sleep: Callable[[float], object] = time.sleep,
) -> Path:
    """Download ``uri`` (s3://bucket/key) into the folder ``into``; refuse bytes of another digest.
    CodeArchiveError for what the user wrote; CodeFetchUnavailableError when S3 kept failing."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc or not parsed.path.strip("/"):
        raise CodeArchiveError(f"code {uri!r} is not s3://bucket/key")
    if not expected_sha256:
        raise CodeArchiveError(
            f"code archive {uri} comes without code_sha256: refused, its bytes could have been replaced "
            "in S3 since submit (give the spec's code_sha256; gpujobs submit computes it for a folder it packs)"
        )
    s3 = s3_client() if s3 is None else s3
    target = into / "code.tar.gz"
    for attempt in range(1, attempts + 1):
        try:
            s3.download_file(parsed.netloc, parsed.path.lstrip("/"), str(target))
            break
        except Exception as exc:
            if not is_transient(exc):
                if _is_client_error(exc):  # NoSuchKey, AccessDenied, ...: the archive the user named
                    raise CodeArchiveError(f"cannot read the code archive {uri}: {exc}") from exc
                raise
            if attempt == attempts:
                raise CodeFetchUnavailableError(
                    f"S3 kept failing while the code archive {uri} was fetched ({attempts} tries): {exc}"
                ) from exc
            pause = FETCH_BACKOFF_SECONDS * 2 ** (attempt - 1)
            log.warning("fetching the code archive %s failed (try %d): %s; again in %.0f s", uri, attempt, exc, pause)
            sleep(pause)
    with open(target, "rb") as handle:
        actual = hashlib.file_digest(handle, "sha256").hexdigest()
    if actual != expected_sha256:
        raise CodeArchiveError(f"code archive {uri} has SHA-256 {actual}, the job names {expected_sha256}")
    return target


def _member_path(member: tarfile.TarInfo) -> PurePosixPath:
    name = member.name.removeprefix("./")
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\\" in name:
        raise CodeArchiveError(f"code archive member {member.name[:120]!r} is not a path inside the working dir")
    if not (member.isfile() or member.isdir()):
        raise CodeArchiveError(f"code archive member {member.name[:120]!r} is a link or special file: refused")
    return path


def check_members(members: list[tarfile.TarInfo]) -> list[tuple[PurePosixPath, tarfile.TarInfo]]:
    """Every member as a safe relative path, or CodeArchiveError before anything is written."""
    if len(members) > MAX_MEMBERS:
        raise CodeArchiveError(f"code archive has {len(members)} entries, more than {MAX_MEMBERS}")
    total = sum(m.size for m in members if m.isfile())
    if total > MAX_UNPACKED_BYTES:
        raise CodeArchiveError(f"code archive unpacks to {total} bytes, more than {MAX_UNPACKED_BYTES}")
    return [(_member_path(m), m) for m in members]


def unpack(archive: Path, dest: Path) -> int:
    """Write the archive's files under ``dest``; returns how many files were written."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            checked = check_members(tar.getmembers())
            if _DATA_FILTER is not None:  # all first, so a refusal still writes nothing (the archive adds no link)
                checked = [(path, _DATA_FILTER(member, str(dest))) for path, member in checked]
            written = 0
            for path, member in checked:
                target = dest.joinpath(*path.parts)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file always has contents
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                with source, os.fdopen(os.open(target, flags, member.mode & 0o777), "wb") as out:
                    while chunk := source.read(_CHUNK):
                        out.write(chunk)
                written += 1
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CodeArchiveError(f"cannot unpack the code archive: {exc}") from exc
    return written


def install(uri: str, sha256: str, dest: Path) -> None:
    """Fetch, verify and unpack the job's code into ``dest`` (the command's working directory)."""
    with tempfile.TemporaryDirectory(prefix="gpujobs-code-") as scratch:
        count = unpack(fetch(uri, sha256, Path(scratch)), dest)
    log.info("unpacked %d file(s) of %s into %s", count, uri, dest)
