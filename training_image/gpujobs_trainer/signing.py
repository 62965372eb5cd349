"""Signing reports, so the control plane knows they come from this job's attempt.

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


def canonical(detail_type: str, detail: Mapping[str, Any], *, signed_at: int) -> bytes:
    signed = {name: detail.get(name) for name in SIGNED_FIELDS[detail_type]}
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
