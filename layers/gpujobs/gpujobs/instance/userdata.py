"""EC2 user data for a training instance: a fixed shell part that loads the bootstrap, plus the run document.

The bootstrap (the modules of this package but this one) does not travel in user data: EC2 allows
16 KB of it, and the bootstrap alone, gzipped, came to 12.6 KB, leaving a job too little room and
the bootstrap none to grow (CloudWatch Logs, EFA devices). The launcher stores it once per content
in the stack's bucket (`bootstrap_bundle()` at `bootstrap_key()`, which names its SHA-256), and the
shell part carries only a loader pinned to that digest: python3 reads the object with the instance
role (which may only read `bootstrap/*`), refuses it and powers off unless its SHA-256 is the one
user data names, then writes the modules out and runs `gpujobs.instance.bootstrap`. Only the
launcher writes user data, so an object swapped in S3 after launch is never run. The loader is one
heredoc with a quoted delimiter, so the shell expands nothing.

The job travels only in the `application/json` part (`run.json`), written as one line of ASCII JSON:
no job string can start a line, so none can close a MIME part or the heredoc. The bootstrap reads
that part back from IMDS as data. The shell part is the same bytes for every job of one stack and
bootstrap version. A document too large for user data makes `render_user_data` raise
`UserDataTooLargeError`: store it in S3 and render a `RunDocumentPointer` instead.

Docstrings are for readers of this repository, so the stored bundle leaves them out, keeping line
numbers. Cheap to import (the launch Lambda does): stdlib, gpujobs.domain, the contract and the
stdlib-only `rundoc`.
"""

from __future__ import annotations

import ast
import functools
import gzip
import hashlib
import io
import json
import tokenize
from pathlib import Path

from gpujobs.contract import BOOTSTRAP_OBJECT_PREFIX
from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.instance.contract import EXIT_BOOTSTRAP_FAILED
from gpujobs.instance.errors import BootstrapError
from gpujobs.instance.rundoc import extract_run_json, is_pointer

MAX_USER_DATA_BYTES = 16384
"""EC2's limit on raw user data, before base64 encoding."""
HEREDOC_DELIMITER = "GPUJOBS_BOOTSTRAP_EOF"
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
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys, boto3; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
    PY="$candidate"; break
  fi
done
if [ -z "$PY" ]; then
  PY=python3
  dnf -y install python3-boto3 || (apt-get update && apt-get -y install python3-boto3) || python3 -m pip install boto3
fi
# The loader: fetch the bootstrap the launcher stored, run it only if its SHA-256 is the one pinned here.
exec "$PY" - <<'{HEREDOC_DELIMITER}'
"""
_LOADER = f"""
import gzip, hashlib, json, os, subprocess, sys, tempfile, time

import boto3


def fetch():
    s3 = boto3.client("s3", region_name=REGION)
    for attempt in range(5):
        try:
            return s3.get_object(Bucket=BUCKET, Key=KEY)["Body"].read()
        except Exception as exc:
            print("gpujobs-loader: cannot read s3://%s/%s: %s" % (BUCKET, KEY, exc), flush=True)
            time.sleep(2**attempt)
    return b""


body = fetch()
if hashlib.sha256(body).hexdigest() != SHA256:
    print("gpujobs-loader: s3://%s/%s is not the bootstrap with SHA-256 %s: refused" % (BUCKET, KEY, SHA256), flush=True)
    subprocess.run(["shutdown", "-h", "now"], check=False)
    sys.exit({EXIT_BOOTSTRAP_FAILED})
root = tempfile.mkdtemp(prefix="gpujobs-bootstrap.")
for name, code in json.loads(gzip.decompress(body)).items():
    os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    with open(os.path.join(root, name), "w", encoding="ascii") as module:
        module.write(code)
sys.path.insert(0, root)
from gpujobs.instance.bootstrap import main

sys.exit(main())
{HEREDOC_DELIMITER}
"""
_RUN_UNPACKED = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpujobs.instance.bootstrap import main; sys.exit(main())"
)
"""The loader's last lines, for `bootstrap_command`: the folder comes as argv[1], never spliced into code."""


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
def bootstrap_bundle() -> bytes:
    """The object the launcher stores: the modules as one gzipped JSON object (deterministic bytes)."""
    modules = json.dumps(bootstrap_modules(), ensure_ascii=True, sort_keys=True, separators=(",", ":"))
    return gzip.compress(modules.encode("ascii"), compresslevel=9, mtime=0)


def bootstrap_key() -> str:
    """Where in the stack's bucket the bundle is stored: named by its SHA-256, so never overwritten."""
    return f"{BOOTSTRAP_OBJECT_PREFIX}{hashlib.sha256(bootstrap_bundle()).hexdigest()}.json.gz"


@functools.cache
def bootstrap_script(*, bucket: str, region: str) -> str:
    """The fixed shell part: the loader of the bundle stored in `bucket`, pinned to its SHA-256."""
    pins = {"REGION": region, "BUCKET": bucket, "KEY": bootstrap_key()}
    pins["SHA256"] = hashlib.sha256(bootstrap_bundle()).hexdigest()
    constants = "".join(f"{name} = {json.dumps(value)}\n" for name, value in pins.items())
    return _SHELL_PROLOGUE + constants + _LOADER


def unpack_bootstrap(folder: Path) -> Path:
    """The bundle's modules written under `folder`, as the loader writes them on an instance.

    For what runs the bootstrap outside EC2 (the local cloud, tests): the same bytes under any
    Python, which need not have gpujobs installed. Idempotent.
    """
    for name, code in bootstrap_modules().items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code, encoding="ascii")
    return folder


def bootstrap_command(python: str, folder: Path) -> list[str]:
    """argv that runs the bootstrap unpacked at `folder` (`unpack_bootstrap`) with `python`, as the
    loader runs it: `folder` first on sys.path, then `main()`. The bootstrap's own arguments follow."""
    return [python, "-c", _RUN_UNPACKED, str(folder)]


def _part(content_type: str, filename: str, body: str) -> str:
    return (
        f'--{_BOUNDARY}\nContent-Type: {content_type}; charset="us-ascii"\nMIME-Version: 1.0\n'
        f'Content-Transfer-Encoding: 7bit\nContent-Disposition: attachment; filename="{filename}"\n\n'
        f"{body}\n"
    )


def render_mime(doc: RunDocument | RunDocumentPointer, *, bucket: str, region: str) -> str:
    """The uncompressed MIME multipart user data (ASCII), loading the bootstrap stored in `bucket`.

    Fields at their defaults are left out (the bootstrap fills the same defaults), so a job pays in
    user data only for the features it uses.
    """
    payload = json.dumps(
        doc.model_dump(mode="json", exclude_defaults=True), ensure_ascii=True, separators=(",", ":"), sort_keys=True
    )
    return (
        f'Content-Type: multipart/mixed; boundary="{_BOUNDARY}"\nMIME-Version: 1.0\n\n'
        + _part("text/x-shellscript", "gpujobs-bootstrap.sh", bootstrap_script(bucket=bucket, region=region))
        + _part("application/json", "run.json", payload)
        + f"--{_BOUNDARY}--\n"
    )


def render_user_data(doc: RunDocument | RunDocumentPointer, *, bucket: str, region: str) -> bytes:
    """Raw user data (not base64): MIME, gzipped when that is what fits; the bundle (`bootstrap_bundle`)
    must be stored at `bootstrap_key()` in `bucket` before an instance boots with it.

    `ec2.run_instances(UserData=...)` base64-encodes bytes itself; launch template data needs
    `base64.b64encode(...)` by the caller. Raises UserDataTooLargeError when even gzip does not fit.
    """
    mime = render_mime(doc, bucket=bucket, region=region).encode("ascii")
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
