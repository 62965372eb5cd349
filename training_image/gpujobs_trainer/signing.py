"""Signing reports, so the control plane knows they come from this job's attempt; and checkpoints,
so a resume knows they are this job's (the second half of this module).

The bootstrap gives the container its attempt's report key as ``GPUJOBS_REPORT_KEY`` (hex). Every
report the trainer publishes carries ``signed_at`` (Unix seconds) and ``signature``: an HMAC-SHA256
under that key of a canonical form of the report (the scheme, the detail-type, ``signed_at`` and the
fields the control plane acts on, as compact JSON with sorted keys). The control plane ignores a
report whose proof is missing, wrong or stale, so another job cannot forge this job's reports.

This is the trainer's own copy (it imports nothing from gpujobs); a test signs the same reports
here, in the bootstrap and in the control plane's verifier and checks they agree. The key is never
logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Mapping
from typing import Any

REPORT_KEY_ENV = "GPUJOBS_REPORT_KEY"
REPORT_SIGNATURE_SCHEME = "gpujobs-report-v1"
SIGNED_FIELDS = {
    "Checkpoint Committed": ("job_id", "attempt", "step", "uri"),
    "Training Heartbeat": ("job_id", "attempt", "step"),
    "Job Exited": ("job_id", "attempt", "exit_code", "instance_id", "node_rank"),
}
"""Per detail-type, the fields the signature covers: the ones the control plane acts on."""
SIGNED_EXTENSIONS: dict[str, tuple[str, ...]] = {
    "Training Heartbeat": ("metrics", "steps_per_second", "samples_per_second")
}
"""Covered too when the report carries the first of them (every heartbeat of this trainer does)."""


def signed_field_names(detail_type: str, detail: Mapping[str, Any]) -> tuple[str, ...]:
    extension = SIGNED_EXTENSIONS.get(detail_type, ())
    carried = bool(extension) and detail.get(extension[0]) is not None
    return SIGNED_FIELDS[detail_type] + (extension if carried else ())


def canonical(detail_type: str, detail: Mapping[str, Any], *, signed_at: int) -> bytes:
    signed = {name: detail.get(name) for name in signed_field_names(detail_type, detail)}
    return json.dumps(
        [REPORT_SIGNATURE_SCHEME, detail_type, signed_at, signed], sort_keys=True, separators=(",", ":")
    ).encode()


def key_from_env(env: Mapping[str, str] | None = None) -> bytes:
    """The attempt's report key, or b"" when none was given (reports then go unsigned, and ignored)."""
    text = (os.environ if env is None else env).get(REPORT_KEY_ENV, "").strip()
    try:
        return bytes.fromhex(text)
    except ValueError:
        return b""


def signed(key: bytes, detail_type: str, detail: dict[str, Any], *, now: float | None = None) -> dict[str, Any]:
    """``detail`` plus its proof; unchanged without a key."""
    if not key:
        return detail
    signed_at = int(time.time() if now is None else now)
    signature = hmac.new(key, canonical(detail_type, detail, signed_at=signed_at), hashlib.sha256).hexdigest()
    return {**detail, "signed_at": signed_at, "signature": signature}


# ---- checkpoints ------------------------------------------------------------------------------
CHECKPOINT_KEY_ENV = "GPUJOBS_CHECKPOINT_KEY"
CHECKPOINT_SIGNATURE_SCHEME = "gpujobs-checkpoint-v1"
"""A commit marker (COMMIT.json) and a synced folder's manifest are signed with the JOB's checkpoint
key (`gpujobs.domain.report_auth.checkpoint_key`: derived from the stack secret and the job id, so
every attempt of the job holds the same key and no other job can compute it). A resume verifies the
signature before it trusts anything the file lists, so a checkpoint another job planted, or one of
another job's relabelled as this job's, is skipped."""


def checkpoint_key_from_env(env: Mapping[str, str] | None = None) -> bytes:
    """The job's checkpoint key, or b"" when none was given (checkpoints are then neither signed
    nor required to be: a local run, or a stack that does not hand keys out yet)."""
    text = (os.environ if env is None else env).get(CHECKPOINT_KEY_ENV, "").strip()
    try:
        return bytes.fromhex(text)
    except ValueError:
        return b""


def checkpoint_canonical(kind: str, payload: Mapping[str, Any]) -> bytes:
    """The signed bytes: the scheme, what the file is (``commit`` or ``manifest``) and its content
    as parsed (compact JSON, sorted keys), without the signature itself."""
    body = {name: value for name, value in payload.items() if name != "signature"}
    return json.dumps([CHECKPOINT_SIGNATURE_SCHEME, kind, body], sort_keys=True, separators=(",", ":")).encode()


def checkpoint_signature(key: bytes, kind: str, payload: Mapping[str, Any]) -> str:
    return hmac.new(key, checkpoint_canonical(kind, payload), hashlib.sha256).hexdigest()


def signature_problem(key: bytes, kind: str, payload: Mapping[str, Any]) -> str:
    """Why ``payload`` (with its ``signature``) is not signed by ``key``; '' when it is, or when
    there is no key to check with."""
    if not key:
        return ""
    signature = payload.get("signature")
    if not isinstance(signature, str) or not signature:
        return "it is not signed (written without this job's checkpoint key, or planted)"
    expected = checkpoint_signature(key, kind, payload)
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
        return "its signature is not this job's (another job's checkpoint, or tampered with)"
    return ""
