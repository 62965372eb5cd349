"""EC2 user data for a training instance: a fixed shell part plus the run document as JSON.

The shell part is the same bytes for every job. It carries the bootstrap, the modules of this
package, as plain files: each is written out through a heredoc with a quoted delimiter, so the shell
expands nothing, and python3 then runs `gpujobs.instance.bootstrap` from them. The job travels only
in the `application/json` part (`run.json`), written as one line of ASCII JSON: no job string can
start a line, so none can close a MIME part or a heredoc. The bootstrap reads that part back from
IMDS as data.

Why plain files in one gzip stream and not a zip: EC2 takes at most 16384 bytes of raw user data,
and the MIME document is gzipped as a whole (cloud-init and the bootstrap both accept gzip). Text
compresses best in that one stream; a zip compresses each module alone and its base64 does not
compress again (the modules as a base64 zip came to 17 KB, over the limit). Docstrings are for
readers of this repository, so the shipped copy leaves them out, keeping line numbers.
When even gzip does not fit, `render_user_data` raises `UserDataTooLargeError`: store the document
in S3 and render a `RunDocumentPointer` instead.

Cheap to import (the launch Lambda does): stdlib, gpujobs.domain and the stdlib-only `rundoc`.
"""

from __future__ import annotations

import ast
import functools
import gzip
import io
import json
import tokenize
from pathlib import Path

from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.instance.errors import BootstrapError
from gpujobs.instance.rundoc import extract_run_json, is_pointer

MAX_USER_DATA_BYTES = 16384
"""EC2's limit on raw user data, before base64 encoding."""
HEREDOC_DELIMITER = "GPUJOBS_BOOTSTRAP_EOF"
MODULE_DELIMITER = "GPUJOBS_MODULE_EOF"
BOOTSTRAP_LOG = "/var/log/gpujobs-bootstrap.log"
NOT_BUNDLED = frozenset({"userdata.py"})
"""Modules of gpujobs.instance that stay in the Lambda: everything else runs on the instance."""
_PACKAGE = Path(__file__).parent
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
# The program: the gpujobs.instance package, one file per module.
BUNDLE=$(mktemp -d -t gpujobs-bootstrap.XXXXXX)
mkdir -p "$BUNDLE/gpujobs/instance"
"""
_SHELL_EPILOGUE = f"""# python3 reading its program from stdin imports from the current directory.
cd "$BUNDLE"
exec "$PY" - <<'{HEREDOC_DELIMITER}'
import sys

from gpujobs.instance.bootstrap import main

sys.exit(main())
{HEREDOC_DELIMITER}
"""


class UserDataTooLargeError(ValueError):
    """Even gzipped, the user data exceeds EC2's limit; launch with a RunDocumentPointer instead."""

    def __init__(self, size: int) -> None:
        super().__init__(f"user data is {size} bytes gzipped; EC2 allows {MAX_USER_DATA_BYTES}")
        self.size = size


class UserDataError(ValueError):
    """User data that holds no readable run document."""


def without_docstrings(source: str) -> str:
    """`source` with every docstring (any statement that is only a string) replaced by `""`, and no comments.

    Lines are blanked, never removed, so a traceback on the instance points at the repository's line.
    """
    lines = source.splitlines(keepends=True)
    comments = [t.start for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for row, col in comments:  # a comment runs to the end of its line
        lines[row - 1] = lines[row - 1][:col].rstrip() + "\n"
    docstrings = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]
    for node in sorted(docstrings, key=lambda node: (node.lineno, node.col_offset), reverse=True):
        first, last = node.lineno, node.end_lineno or node.lineno
        line = lines[first - 1][: node.col_offset] + '""' + lines[last - 1][node.end_col_offset :]
        lines[first - 1 : last] = [line.rstrip() + "\n", *["\n"] * (last - first)]
    return "".join(lines)


@functools.cache
def bootstrap_modules() -> dict[str, str]:
    """What the instance gets: path in the bundle -> the module's code (ASCII, without docstrings)."""
    modules = {"gpujobs/__init__.py": ""}  # the layer's own gpujobs/__init__.py is not the bootstrap's concern
    for path in sorted(_PACKAGE.glob("*.py")):
        if path.name not in NOT_BUNDLED:
            modules[f"gpujobs/instance/{path.name}"] = without_docstrings(path.read_text(encoding="ascii"))
    return modules


@functools.cache
def bootstrap_script() -> str:
    """The fixed shell part: identical for every job."""
    files = []
    for name, code in bootstrap_modules().items():
        if {HEREDOC_DELIMITER, MODULE_DELIMITER} & set(code.splitlines()):
            raise AssertionError(f"{name} must not hold a heredoc delimiter on a line of its own")
        files.append(f"""cat >"$BUNDLE/{name}" <<'{MODULE_DELIMITER}'\n{code.rstrip()}\n{MODULE_DELIMITER}\n""")
    return _SHELL_PROLOGUE + "".join(files) + _SHELL_EPILOGUE


def _part(content_type: str, filename: str, body: str) -> str:
    return (
        f'--{_BOUNDARY}\nContent-Type: {content_type}; charset="us-ascii"\nMIME-Version: 1.0\n'
        f'Content-Transfer-Encoding: 7bit\nContent-Disposition: attachment; filename="{filename}"\n\n'
        f"{body}\n"
    )


def render_mime(doc: RunDocument | RunDocumentPointer) -> str:
    """The uncompressed MIME multipart user data (ASCII).

    Fields at their defaults are left out (the bootstrap fills the same defaults), so a job pays in
    user data only for the features it uses.
    """
    payload = json.dumps(
        doc.model_dump(mode="json", exclude_defaults=True), ensure_ascii=True, separators=(",", ":"), sort_keys=True
    )
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
        data = extract_run_json(raw.encode() if isinstance(raw, str) else raw)
    except BootstrapError as exc:
        raise UserDataError(str(exc)) from exc
    if is_pointer(data):
        return RunDocumentPointer.model_validate(data)
    return RunDocument.model_validate(data)
