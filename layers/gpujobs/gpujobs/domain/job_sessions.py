"""Who may have a job's session: only an instance the jobs table lists in that job's live attempt.

The job role (template.yaml `JobRole`) trusts the credentials function alone. An instance asks it
for its attempt's session and proves who it is the way Vault's AWS IAM auth and
aws-iam-authenticator do: it signs an `sts:GetCallerIdentity` request with its instance-role
credentials (a signed header names the stack, job and attempt the proof is for) and hands over the
headers and body, never a URL; the function sends them to its own STS endpoint, and STS answers
with the signer's ARN: `arn:aws:sts::<account>:assumed-role/<instance role>/<instance id>` (EC2
names the instance role's session after the instance). The function then reads the job's record
and mints the session with the tags and the session policy rendered from the record
(`domain.job_access`), never from anything the caller sent.

This module is the pure part: what a proof must look like before it is sent (`proof_problem`),
whose ARN STS returned (`instance_of`), and whether that instance may have that attempt's session
(`decide`). Each refusal names what did not match; `retryable` ones are "not yet" (the launcher has
not recorded the attempt's instances yet), every other is final.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import parse_qsl

from gpujobs.contract import JOB_SESSION_HEADER, job_session_purpose
from gpujobs.domain.job import Job

IDENTITY_BODY = {"Action": "GetCallerIdentity", "Version": "2011-06-15"}
"""The one STS request a proof may be: anything else would make the function the caller's proxy."""
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
_ASSUMED_ROLE = re.compile(
    r"arn:(?P<partition>[\w-]+):sts::(?P<account>\d{12}):assumed-role/(?P<role>[\w+=,.@-]+)/(?P<session>[\w+=,.@-]+)"
)
_SIGNED_HEADERS = re.compile(r"SignedHeaders=([^,\s]+)")


class Refusal(StrEnum):
    """Why a session was not granted: each value is what the log and the caller are told."""

    MALFORMED_REQUEST = "malformed-request"
    IDENTITY_NOT_PROVEN = "identity-not-proven"
    NOT_THE_INSTANCE_ROLE = "not-the-instance-role"
    NO_SUCH_JOB = "no-such-job"
    JOB_ENDED = "job-ended"
    ATTEMPT_NOT_YET_RECORDED = "attempt-not-yet-recorded"
    ATTEMPT_REPLACED = "attempt-replaced"
    ATTEMPT_OVER = "attempt-over"
    NOT_IN_ATTEMPT = "not-in-attempt"
    INSTANCE_GONE = "instance-gone"
    UNAVAILABLE = "unavailable"

    @property
    def retryable(self) -> bool:
        """Worth asking again shortly: the record may not list the instances yet, or a dependency failed."""
        return self in (Refusal.ATTEMPT_NOT_YET_RECORDED, Refusal.UNAVAILABLE)


class SessionRefusedError(Exception):
    """A session request refused, with the reason and what did not match."""

    def __init__(self, refusal: Refusal, detail: str) -> None:
        super().__init__(f"{refusal.value}: {detail}")
        self.refusal, self.detail = refusal, detail


@dataclass(frozen=True)
class SessionAsk:
    """What an instance asks for: one job's attempt, with its signed identity proof."""

    job_id: str
    attempt: int
    headers: Mapping[str, str]
    body: str


@dataclass(frozen=True)
class Grant:
    """The session the record allows: for this job, team and attempt, to this instance."""

    job_id: str
    team: str
    attempt: int
    instance_id: str


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


def proof_problem(ask: SessionAsk, *, stack: str, sts_host: str) -> str | None:
    """What is wrong with the proof before STS sees it, or None.

    It must be a SigV4-signed GetCallerIdentity for this function's STS endpoint whose signature
    covers the host and the purpose header, and the purpose must name this stack, job and attempt.
    STS then checks the signature itself: a header it covers cannot have been changed.
    """
    if dict(parse_qsl(ask.body, keep_blank_values=True)) != IDENTITY_BODY:
        return "the signed request is not sts:GetCallerIdentity"
    authorization = _header(ask.headers, "Authorization") or ""
    signed = _SIGNED_HEADERS.search(authorization)
    if not authorization.startswith("AWS4-HMAC-SHA256 ") or signed is None:
        return "the request is not signed with SigV4 (no Authorization header)"
    covered = set(signed.group(1).lower().split(";"))
    missing = {"host", JOB_SESSION_HEADER.lower()} - covered
    if missing:
        return f"the signature does not cover {', '.join(sorted(missing))}"
    host = _header(ask.headers, "Host")
    if host != sts_host:
        return f"signed for host {host!r}, but this function verifies with {sts_host!r}"
    purpose, wanted = _header(ask.headers, JOB_SESSION_HEADER), job_session_purpose(stack, ask.job_id, ask.attempt)
    if purpose != wanted:
        return f"the proof is for {purpose!r}, not {wanted!r}"
    return None


def instance_of(caller_arn: str, *, instance_role_arn: str) -> str:
    """The instance id STS named, when the signer is the stack's instance role; else SessionRefusedError."""
    caller = _ASSUMED_ROLE.fullmatch(caller_arn)
    role = re.fullmatch(r"arn:[\w-]+:iam::(\d{12}):role/(?:.*/)?([\w+=,.@-]+)", instance_role_arn)
    if role is None:
        raise ValueError(f"INSTANCE_ROLE_ARN {instance_role_arn!r} is not a role ARN")
    if caller is None or (caller["account"], caller["role"]) != role.groups():
        raise SessionRefusedError(Refusal.NOT_THE_INSTANCE_ROLE, f"the signer is {caller_arn}, not {instance_role_arn}")
    if not INSTANCE_ID.fullmatch(caller["session"]):
        raise SessionRefusedError(
            Refusal.NOT_THE_INSTANCE_ROLE, f"the instance role's session {caller['session']!r} is not an instance id"
        )
    return caller["session"]


def decide(job: Job, *, attempt: int, instance_id: str) -> Grant:
    """The grant when `instance_id` is one of `job`'s live current attempt `attempt`; else SessionRefusedError."""
    where = f"job {job.job_id} attempt {attempt}"
    if job.state.is_terminal:
        raise SessionRefusedError(Refusal.JOB_ENDED, f"{where}: the job is {job.state.value}")
    current = job.current_attempt
    if current is None or current.number < attempt:
        latest = "no attempt" if current is None else f"attempt {current.number}"
        raise SessionRefusedError(Refusal.ATTEMPT_NOT_YET_RECORDED, f"{where}: the record has {latest} so far")
    if current.number > attempt:
        raise SessionRefusedError(Refusal.ATTEMPT_REPLACED, f"{where}: replaced by attempt {current.number}")
    if current.is_over:
        raise SessionRefusedError(Refusal.ATTEMPT_OVER, f"{where}: over ({current.end_reason or 'ended'})")
    if not current.instance_ids:
        raise SessionRefusedError(Refusal.ATTEMPT_NOT_YET_RECORDED, f"{where}: its instances are not recorded yet")
    leaving = current.regroup is not None and instance_id in current.regroup.lost
    if instance_id not in current.instance_ids and not leaving:  # a reclaimed node still saves its part
        listed = ", ".join(current.instance_ids)
        raise SessionRefusedError(Refusal.NOT_IN_ATTEMPT, f"{where}: {instance_id} is not one of {listed}")
    if instance_id in current.gone:
        raise SessionRefusedError(Refusal.INSTANCE_GONE, f"{where}: {instance_id} was seen gone")
    return Grant(job_id=job.job_id, team=job.require_spec().team, attempt=attempt, instance_id=instance_id)
