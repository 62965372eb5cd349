"""Authenticated reports: a `Job Exited`, `Checkpoint Committed` or `Training Heartbeat` counts only
when it proves it comes from an instance of the attempt it names.

Why this scheme. Every job's code can call `PutEvents` on the stack's bus (that is how it reports),
so the bus itself proves nothing about who sent an event: without a proof, one team's job could fail,
"succeed" or stop another team's job with a forged report. The proof is an HMAC-SHA256 over a
canonical form of the report, under a key that only that attempt's instances hold:

* **The key** of attempt `n` of job `j` is `HMAC-SHA256(stack secret, "gpujobs-report-v1|j|n")`. The
  stack secret is a Secrets Manager secret that template.yaml generates and that only the functions
  which launch (to hand a key out) or verify reports may read. Keys are derived, never stored: the
  verifier recomputes the key from the ids the report names, so nothing per attempt is kept in the
  jobs table, and a key leaks nothing about the secret or any other attempt's key.
* **Handing it out.** The launch puts the key in the attempt's user data (in the run document, or
  beside the pointer when the document is offloaded to S3, so it never lands in S3). User data is
  readable by the host and by principals allowed `ec2:DescribeInstanceAttribute`, which no job is;
  the container cannot reach IMDS. The bootstrap signs its exit report and gives the key to the
  container as `GPUJOBS_REPORT_KEY`, whose trainer signs its reports with it.
* **What is signed**: the scheme, the detail-type, the time of signing and exactly the fields the
  control plane acts on (`contract.REPORT_SIGNED_FIELDS`, and a heartbeat's metrics and throughput
  when it carries them: `contract.REPORT_SIGNED_EXTENSIONS`), as compact JSON with sorted keys. The
  verifier rebuilds that form from the *parsed* values it is about to act on, so a report cannot be
  verified on one value and acted on by another.
* **Freshness.** A report signed longer ago than `REPORT_MAX_AGE` (or in the future beyond the
  allowed skew) is refused. The window is as long as EventBridge and Lambda may legitimately keep
  retrying an event (an hour each, template.yaml), plus clock skew: a shorter one would throw away
  real reports that were delivered late. Replays inside the window change nothing: every decision
  on a report is idempotent, and a key is only ever good for its own attempt.

What it does not stop: a job's own code holds its own attempt's key and can forge its own reports.
That harms nobody else (it could as well exit with any code, or simply stop training), and a report
for another job, or for another attempt of its own job, needs a key it cannot compute.

**Checkpoint keys.** A job's checkpoints (the trainer's commit markers, a synced folder's
manifests) are signed with `checkpoint_key`: the same derivation under another label, per JOB
rather than per attempt, so that a replacement verifies what its predecessor committed, and no
other job (which may write the checkpoint prefix until per-job credentials scope it) can sign a
checkpoint this job would resume from. It travels like the report key (user data only, the
container's `GPUJOBS_CHECKPOINT_KEY`); nothing on the control plane verifies it.

The bootstrap (`gpujobs/instance/signing.py`, stdlib only) and the trainer
(`gpujobs_trainer/signing.py`, another artifact) keep their own copies of the signing half; a test
signs the same reports with all three and checks that this module verifies them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum

from gpujobs.contract import REPORT_SIGNATURE_SCHEME, report_signed_field_names

REPORT_MAX_AGE = timedelta(minutes=65)
"""EventBridge's and Lambda's retry windows (MaximumEventAgeInSeconds: 3600) plus five minutes of skew."""
CHECKPOINT_KEY_LABEL = "gpujobs-checkpoint-v1"
"""The label of a job's checkpoint key, apart from every report key's."""
REPORT_MAX_SKEW = timedelta(minutes=5)
"""How far in the future a signing time may be (an instance's clock running ahead)."""


class Proof(StrEnum):
    """The verdict on a report's proof; anything but VALID means the report is ignored and counted."""

    VALID = "valid"
    MISSING = "no signature"
    MISMATCH = "signature does not match"
    STALE = "signed outside the freshness window"


def report_key(stack_secret: bytes, *, job_id: str, attempt: int) -> bytes:
    """The key of one attempt: only the holder of the stack secret can compute it."""
    label = f"{REPORT_SIGNATURE_SCHEME}|{job_id}|{attempt}".encode()
    return hmac.new(stack_secret, label, hashlib.sha256).digest()


def checkpoint_key(stack_secret: bytes, *, job_id: str) -> bytes:
    """The key a job's checkpoints are signed with: one per job, for all its attempts."""
    return hmac.new(stack_secret, f"{CHECKPOINT_KEY_LABEL}|{job_id}".encode(), hashlib.sha256).digest()


def canonical(detail_type: str, fields: Mapping[str, object], *, signed_at: int) -> bytes:
    """The bytes that are signed: scheme, detail-type, signing time and the acted-on fields."""
    signed = {name: fields.get(name) for name in report_signed_field_names(detail_type, fields)}
    return json.dumps(
        [REPORT_SIGNATURE_SCHEME, detail_type, signed_at, signed], sort_keys=True, separators=(",", ":")
    ).encode()


def sign(key: bytes, detail_type: str, fields: Mapping[str, object], *, signed_at: int) -> str:
    return hmac.new(key, canonical(detail_type, fields, signed_at=signed_at), hashlib.sha256).hexdigest()


def verify(
    key: bytes,
    detail_type: str,
    fields: Mapping[str, object],
    *,
    signed_at: int | None,
    signature: str | None,
    now: datetime,
) -> Proof:
    """Whether `signature` proves the report, compared in constant time, and whether it is fresh."""
    if signed_at is None or not signature:
        return Proof.MISSING
    expected = sign(key, detail_type, fields, signed_at=signed_at)
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
        return Proof.MISMATCH
    age = now.timestamp() - signed_at
    if not -REPORT_MAX_SKEW.total_seconds() <= age <= REPORT_MAX_AGE.total_seconds():
        return Proof.STALE
    return Proof.VALID


def verify_any(
    keys: Sequence[bytes],
    detail_type: str,
    fields: Mapping[str, object],
    *,
    signed_at: int | None,
    signature: str | None,
    now: datetime,
) -> Proof:
    """`verify` under each key a report may be signed with (the stack secret's current and, during
    a rotation's grace, previous version): VALID under any, else STALE when one matched but too late."""
    proofs = [verify(key, detail_type, fields, signed_at=signed_at, signature=signature, now=now) for key in keys]
    for verdict in (Proof.VALID, Proof.STALE, Proof.MISSING):
        if verdict in proofs:
            return verdict
    return Proof.MISMATCH
