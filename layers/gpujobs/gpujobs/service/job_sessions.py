"""Vend a job's session to the instance the record lists in its live attempt (`domain.job_sessions`).

Check the proof's shape, have STS name its signer, read the job's record (consistently), decide, and
only then assume the job role with the tags and the session policy rendered from the record and the
team configuration. A refusal is an answer, not an error: `vend` returns it with the reason naming
what did not match, for the handler to log and the instance to read. A dependency that fails (STS
unreachable, DynamoDB throttled) propagates: the handler answers "unavailable", which is retryable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpujobs.domain.job_access import session_policy_json, session_tags
from gpujobs.domain.job_sessions import (
    Grant,
    Refusal,
    SessionAsk,
    SessionRefusedError,
    decide,
    instance_of,
    proof_problem,
)
from gpujobs.service.ports import JobNotFoundError, JobStore

if TYPE_CHECKING:
    from gpujobs.domain.teams import TeamDirectory

SESSION_SECONDS = 3600
"""The job role's MaxSessionDuration, and role chaining's limit (the function's own role is assumed)."""


class IdentityRejectedError(Exception):
    """STS refused the proof (a bad or expired signature, unknown keys): the signer is not proven."""


class CallerIdentities(Protocol):
    """Sends a signed `sts:GetCallerIdentity` to this function's STS endpoint."""

    @property
    def host(self) -> str:
        """The endpoint's host: a proof must be signed for it."""
        ...

    def caller_arn(self, *, headers: Mapping[str, str], body: str) -> str:
        """The signer's ARN; IdentityRejectedError when STS refuses the request."""
        ...


class JobRoleSessions(Protocol):
    def assume(self, *, session_name: str, policy: str, tags: Mapping[str, str], seconds: int) -> dict[str, Any]:
        """STS `Credentials` of a new job-role session (AccessKeyId, SecretAccessKey, SessionToken, Expiration)."""
        ...


@dataclass(frozen=True)
class Vended:
    """The answer to one ask: credentials, or the refusal and what did not match."""

    grant: Grant | None = None
    credentials: Mapping[str, Any] | None = None
    refusal: Refusal | None = None
    detail: str = ""

    def payload(self) -> dict[str, Any]:
        """What the instance is sent back (no traceback, no internal names beyond the reason)."""
        if self.credentials is not None:
            creds = self.credentials
            return {
                "credentials": {
                    "AccessKeyId": creds["AccessKeyId"],
                    "SecretAccessKey": creds["SecretAccessKey"],
                    "SessionToken": creds["SessionToken"],
                    "Expiration": creds["Expiration"].isoformat(),
                }
            }
        assert self.refusal is not None
        return {"refused": self.refusal.value, "detail": self.detail, "retryable": self.refusal.retryable}


def session_name(grant: Grant) -> str:
    """`gpujobs-<job>-a<attempt>`, in the characters and length STS allows (CloudTrail shows it)."""
    return re.sub(r"[^\w+=,.@-]", "-", f"gpujobs-{grant.job_id}-a{grant.attempt}")[:64]


@dataclass
class JobSessions:
    store: JobStore
    identities: CallerIdentities
    sessions: JobRoleSessions
    team_directory: Callable[[], TeamDirectory]
    stack_name: str
    bucket: str
    instance_role_arn: str

    def vend(self, ask: SessionAsk) -> Vended:
        try:
            grant = self._grant(ask)
        except SessionRefusedError as refused:
            return Vended(refusal=refused.refusal, detail=refused.detail)
        team = grant.team
        policy = session_policy_json(
            bucket=self.bucket,
            job_id=grant.job_id,
            team=team,
            data_buckets=self.team_directory().data_buckets(team),
        )
        credentials = self.sessions.assume(
            session_name=session_name(grant),
            policy=policy,
            tags=session_tags(job_id=grant.job_id, team=team, attempt=grant.attempt),
            seconds=SESSION_SECONDS,
        )
        return Vended(grant=grant, credentials=credentials, detail=f"to {grant.instance_id}")

    def _grant(self, ask: SessionAsk) -> Grant:
        problem = proof_problem(ask, stack=self.stack_name, sts_host=self.identities.host)
        if problem is not None:
            raise SessionRefusedError(Refusal.MALFORMED_REQUEST, problem)
        try:
            caller = self.identities.caller_arn(headers=ask.headers, body=ask.body)
        except IdentityRejectedError as exc:
            raise SessionRefusedError(Refusal.IDENTITY_NOT_PROVEN, f"STS refused the proof: {exc}") from exc
        instance_id = instance_of(caller, instance_role_arn=self.instance_role_arn)
        try:
            job = self.store.get(ask.job_id)
        except JobNotFoundError as exc:
            raise SessionRefusedError(Refusal.NO_SUCH_JOB, f"no job {ask.job_id} (asked by {instance_id})") from exc
        return decide(job, attempt=ask.attempt, instance_id=instance_id)
