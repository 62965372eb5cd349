"""The run document: read from user data (or the S3 object it points to) and validated with the stdlib.

Everything job-specific reaches the instance as this JSON document, never as shell text. `FIELDS`
mirrors `gpujobs.domain.rundoc.RunDocument` (a unit test keeps the two equal); the checks here are
the pydantic model's, written for a bare Python. The launch Lambda parses user data with these same
functions (`gpujobs.instance.userdata.parse_user_data`), so both sides read it alike.
"""

from __future__ import annotations

import email
import gzip
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from gpujobs.instance.errors import BootstrapError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TEAM_NAME = re.compile(r"^[a-z0-9-]{1,63}$")
"""`gpujobs.domain.spec.TEAM_PATTERN` (a test keeps them equal): safe in a log stream name and an S3 key."""
MAX_KEEP_SECONDS = 24 * 3600
"""`gpujobs.domain.spec_parts.MAX_KEEP_ON_FAILURE`: the longest a failed gang is kept up."""
_REQUIRED = object()
FIELDS: dict[str, tuple[type, Any]] = {
    "version": (int, 1),
    "job_id": (str, _REQUIRED),
    "attempt": (int, _REQUIRED),
    "name": (str, _REQUIRED),
    "image": (str, _REQUIRED),
    "command": (list, _REQUIRED),
    "env": (dict, {}),
    "nodes": (int, 1),
    "gpus_per_node": (int, 1),
    "checkpoint_uri": (str, _REQUIRED),
    "resume_from_step": (int, None),
    "checkpoint_every_minutes": (int, 30),
    "event_bus": (str, ""),
    "region": (str, ""),
    "master_port": (int, 29500),
    "stop_timeout_seconds": (int, 120),
    "wait_for_attempt": (int, None),
    "report_key": (str, ""),
    "checkpoint_key": (str, ""),
    "job_role_arn": (str, ""),
    "credentials_function": (str, ""),
    "stack": (str, ""),
    "session_policy": (str, ""),
    "session_tags": (dict, {}),
    "secrets": (dict, {}),
    "team": (str, ""),
    "log_group": (str, ""),
    "outputs_uri": (str, ""),
    "checkpoint_mode": (str, "gpujobs"),
    "code_uri": (str, ""),
    "code_sha256": (str, ""),
    "setup": (list, []),
    "requirements": (str, ""),
    "venv_cache_uri": (str, ""),
    "trainer_env": (dict, {}),
    "efa_instance_types": (list, []),
    "instance_store_types": (list, []),
    "keep_on_failure_seconds": (int, 0),
    "gpu_counts": (dict, {}),
    "interconnect_floors": (dict, {}),
}
"""Field name -> (type, default); `_REQUIRED` marks a field without a default."""


def extract_run_json(raw: bytes) -> dict[str, Any]:
    """The JSON object in user data: gzip or not, a MIME multipart's one application/json part, or bare."""
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    text: Any = raw
    if not raw.lstrip().startswith(b"{"):
        parts = [p for p in email.message_from_bytes(raw).walk() if p.get_content_type() == "application/json"]
        if len(parts) != 1:
            raise BootstrapError(f"user data holds {len(parts)} application/json parts, expected 1")
        text = parts[0].get_payload(decode=True)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BootstrapError(f"run document is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BootstrapError("run document is not a JSON object")
    return data


POINTER_FIELDS = (
    "run_document_uri",
    "run_document_sha256",
    "report_key",
    "checkpoint_key",
    "job_id",
    "attempt",
    "event_bus",
)
"""Mirrors `gpujobs.domain.rundoc.RunDocumentPointer`; the first two are required."""


def is_pointer(data: dict[str, Any]) -> bool:
    """Whether `data` is a RunDocumentPointer (the document itself was too large for user data)."""
    return "run_document_uri" in data


def check_document(data: dict[str, Any]) -> dict[str, Any]:
    """Validate field names and types (stdlib stand-in for the pydantic model) and fill defaults."""
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise BootstrapError(f"run document has unknown fields {unknown}")
    doc: dict[str, Any] = {}
    for name, (kind, default) in FIELDS.items():
        value = data.get(name, default)
        if value is _REQUIRED:
            raise BootstrapError(f"run document lacks {name}")
        if not (value is None and default is None) and (
            not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        ):
            raise BootstrapError(f"run document field {name} is not a {kind.__name__}")
        doc[name] = value
    if doc["version"] != 1:
        raise BootstrapError(f"run document version {doc['version']} is not supported")
    if not doc["command"] or not all(isinstance(a, str) for a in doc["command"]):
        raise BootstrapError("command must be a non-empty list of strings")
    for key, value in {**doc["env"], **doc["secrets"], **doc["trainer_env"]}.items():
        if not _ENV_NAME.match(key) or key.startswith("DOCKER_") or not isinstance(value, str):
            raise BootstrapError(f"env name {key!r} is not allowed or its value is not a string")
    if set(doc["env"]) & set(doc["secrets"]) or (doc["secrets"] and not doc["job_role_arn"]):
        raise BootstrapError("secrets must not repeat env names, and are read only with a job role")
    if doc["job_role_arn"] and not (doc["credentials_function"] and doc["stack"]):
        raise BootstrapError("a job role is vended by the stack's credentials function: the document names none")
    if not doc["image"] or doc["image"].startswith("-") or any(c.isspace() for c in doc["image"]):
        raise BootstrapError(f"image {doc['image']!r} is not an image reference")
    if not all(isinstance(t, str) for t in doc["efa_instance_types"] + doc["instance_store_types"]):
        raise BootstrapError("efa_instance_types and instance_store_types must be lists of instance type names")
    if not all(isinstance(t, str) and type(n) is int and n >= 0 for t, n in doc["gpu_counts"].items()):
        raise BootstrapError("gpu_counts must map instance type names to GPU counts")
    floors = doc["interconnect_floors"].items()
    if not all(isinstance(t, str) and type(f) in (int, float) and 0 <= f < 1e6 for t, f in floors):
        raise BootstrapError("interconnect_floors must map instance type names to GB/s from 0")
    if not all(isinstance(c, list) and c and all(isinstance(a, str) for a in c) for c in doc["setup"]):
        raise BootstrapError("setup must be a list of commands, each a non-empty list of strings")
    if doc["team"] and not TEAM_NAME.match(doc["team"]):
        raise BootstrapError(f"team {doc['team']!r} is not a team name")
    if not 0 <= doc["keep_on_failure_seconds"] <= MAX_KEEP_SECONDS:
        raise BootstrapError(f"keep_on_failure_seconds {doc['keep_on_failure_seconds']} is not 0 to {MAX_KEEP_SECONDS}")
    if doc["wait_for_attempt"] is not None and not 0 <= doc["wait_for_attempt"] < doc["attempt"]:
        raise BootstrapError(f"wait_for_attempt {doc['wait_for_attempt']} is not an earlier attempt")
    return doc


def load_document(raw: bytes, s3: Callable[[], Any], partial: dict[str, Any]) -> dict[str, Any]:
    """The run document from user data, following an S3 pointer; `partial` keeps what was readable."""
    data = extract_run_json(raw)
    if is_pointer(data):
        # Whom to report to (and the report key) travel beside the pointer, in user data only: kept
        # first, so that a document refused below is still reported as this attempt's exit.
        partial["raw"] = {k: data[k] for k in ("job_id", "attempt", "event_bus", "report_key") if k in data}
        keys = {name: data.get(name, "") for name in ("report_key", "checkpoint_key")}  # user data's, not S3's
        data = {**extract_run_json(_fetch_verified(data, s3)), **keys}
    partial["raw"] = data
    return check_document(data)


def _fetch_verified(pointer: dict[str, Any], s3: Callable[[], Any]) -> bytes:
    """The bytes the pointer names, refused unless their SHA-256 is the one user data carries.

    Only the launcher writes user data; the S3 object could have been replaced after launch, so
    the digest, not the object, is what the bootstrap trusts.
    """
    if not set(POINTER_FIELDS[:2]) <= set(pointer) <= set(POINTER_FIELDS):
        raise BootstrapError(
            f"run document pointer must have {list(POINTER_FIELDS[:2])}, at most {list(POINTER_FIELDS)}"
        )
    uri, expected = str(pointer["run_document_uri"]), str(pointer["run_document_sha256"])
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not key:
        raise BootstrapError(f"run_document_uri {uri!r} is not s3://bucket/key")
    body: bytes = s3().get_object(Bucket=bucket, Key=key)["Body"].read()
    actual = hashlib.sha256(body).hexdigest()
    if actual != expected:
        raise BootstrapError(f"run document at {uri} has SHA-256 {actual}, user data expects {expected}: refused")
    return body
