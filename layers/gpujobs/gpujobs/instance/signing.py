"""The bootstrap's half of authenticated reports: sign the exit report with the attempt's key.

The control plane acts on a `Job Exited` only when it carries an HMAC-SHA256, under the key the
launch put in this attempt's user data, of the canonical form below (`gpujobs.domain.report_auth`
explains the scheme; a test signs the same reports here, in the trainer and in the verifier and
compares them). Stdlib only, like the rest of the bootstrap. The key is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from gpujobs.instance.contract import EVENT_DETAIL_TYPE, EXIT_SIGNED_FIELDS, REPORT_SIGNATURE_SCHEME


def canonical(detail: dict[str, Any], *, signed_at: int) -> bytes:
    """Scheme, detail-type, signing time and the acted-on fields, as compact sorted JSON."""
    signed = {name: detail.get(name) for name in EXIT_SIGNED_FIELDS}
    return json.dumps(
        [REPORT_SIGNATURE_SCHEME, EVENT_DETAIL_TYPE, signed_at, signed], sort_keys=True, separators=(",", ":")
    ).encode()


def signed_exit(detail: dict[str, Any], key_hex: object, *, now: float) -> dict[str, Any]:
    """`detail` with `signed_at` and `signature` added; unchanged without a usable key (the run
    document was unreadable): the control plane then ignores it, and judges the attempt from EC2."""
    try:
        key = bytes.fromhex(key_hex) if isinstance(key_hex, str) and key_hex else b""
    except ValueError:
        key = b""
    if not key:
        return detail
    signed_at = int(now)
    signature = hmac.new(key, canonical(detail, signed_at=signed_at), hashlib.sha256).hexdigest()
    return {**detail, "signed_at": signed_at, "signature": signature}
