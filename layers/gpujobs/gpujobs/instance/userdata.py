"""EC2 user data for a training instance: a fixed shell part plus the run document as JSON.

The shell part is the same bytes for every job: it feeds `bootstrap.py` to python3 through a heredoc
with a quoted delimiter, so the shell expands nothing. The job travels only in the `application/json`
part (`run.json`), written as one line of ASCII JSON: no job string can start a line, so none can
close a MIME part or the heredoc. The bootstrap reads that part back from IMDS as data.

EC2 takes at most 16384 bytes of raw user data. The bootstrap alone is larger than that uncompressed
budget allows for comfortably, so `render_user_data` gzips when needed (cloud-init and the bootstrap
both accept gzip) and always returns bytes. When even that does not fit, it raises
`UserDataTooLargeError`: store the document in S3 and render a `RunDocumentPointer` instead.

Cheap to import (the launch Lambda does): stdlib, gpujobs.domain and the stdlib-only bootstrap module.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.instance import bootstrap

MAX_USER_DATA_BYTES = 16384
"""EC2's limit on raw user data, before base64 encoding."""
HEREDOC_DELIMITER = "GPUJOBS_BOOTSTRAP_EOF"
BOOTSTRAP_LOG = "/var/log/gpujobs-bootstrap.log"
_BOUNDARY = "==GPUJOBS-USER-DATA=="
_SHELL_PROLOGUE = f"""#!/bin/bash
# gpujobs instance bootstrap. These bytes are the same for every job: the job is the application/json
# part of this user data, which the program below reads from IMDS as data. The shell expands nothing.
exec >>{BOOTSTRAP_LOG} 2>&1
PY=
for candidate in /opt/pytorch/bin/python3 /opt/conda/bin/python3 /usr/bin/python3 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import boto3' 2>/dev/null; then
    PY="$candidate"; break
  fi
done
if [ -z "$PY" ]; then
  PY=python3
  dnf -y install python3-boto3 || (apt-get update && apt-get -y install python3-boto3) || python3 -m pip install boto3
fi
exec "$PY" - <<'{HEREDOC_DELIMITER}'
"""


class UserDataTooLargeError(ValueError):
    """Even gzipped, the user data exceeds EC2's limit; launch with a RunDocumentPointer instead."""

    def __init__(self, size: int) -> None:
        super().__init__(f"user data is {size} bytes gzipped; EC2 allows {MAX_USER_DATA_BYTES}")
        self.size = size


class UserDataError(ValueError):
    """User data that holds no readable run document."""


@functools.cache
def bootstrap_script() -> str:
    """The fixed shell part: identical for every job."""
    source = Path(bootstrap.__file__).read_text(encoding="ascii")
    if HEREDOC_DELIMITER in source.splitlines():
        raise AssertionError("bootstrap.py must not hold the heredoc delimiter on a line of its own")
    return f"{_SHELL_PROLOGUE}{source.rstrip()}\n{HEREDOC_DELIMITER}\n"


def _part(content_type: str, filename: str, body: str) -> str:
    return (
        f'--{_BOUNDARY}\nContent-Type: {content_type}; charset="us-ascii"\nMIME-Version: 1.0\n'
        f'Content-Transfer-Encoding: 7bit\nContent-Disposition: attachment; filename="{filename}"\n\n'
        f"{body}\n"
    )


def render_mime(doc: RunDocument | RunDocumentPointer) -> str:
    """The uncompressed MIME multipart user data (ASCII)."""
    payload = json.dumps(doc.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":"), sort_keys=True)
    return (
        f'Content-Type: multipart/mixed; boundary="{_BOUNDARY}"\nMIME-Version: 1.0\n\n'
        + _part("text/x-shellscript", "gpujobs-bootstrap.sh", bootstrap_script())
        + _part("application/json", "run.json", payload)
        + f"--{_BOUNDARY}--\n"
    )


def render_user_data(doc: RunDocument | RunDocumentPointer) -> bytes:
    """Raw user data (not base64): MIME, gzipped when that is what fits.

    `ec2.run_instances(UserData=...)` base64-encodes bytes itself; launch template data needs
    `base64.b64encode(...)` by the caller. Raises UserDataTooLargeError when even gzip does not fit.
    """
    mime = render_mime(doc).encode("ascii")
    if len(mime) <= MAX_USER_DATA_BYTES:
        return mime
    packed = gzip.compress(mime, compresslevel=9, mtime=0)
    if len(packed) > MAX_USER_DATA_BYTES:
        raise UserDataTooLargeError(len(packed))
    return packed


def parse_user_data(raw: bytes | str) -> RunDocument | RunDocumentPointer:
    """The run document (or pointer) in user data, read exactly as the bootstrap reads it."""
    try:
        data = bootstrap.extract_run_json(raw.encode() if isinstance(raw, str) else raw)
    except bootstrap.BootstrapError as exc:
        raise UserDataError(str(exc)) from exc
    if bootstrap.is_pointer(data):
        return RunDocumentPointer.model_validate(data)
    return RunDocument.model_validate(data)
