"""The Job aggregate: its state, its history of transitions and its attempts.

A Job is an immutable value. Every change returns a new Job whose `version` is unchanged: the store
bumps the version when it saves, conditional on the version it read, so two writers can never both
win. Only `transition()` moves the state, and it asks `states.check_transition` first, so the
state machine is enforced in one place whatever code path asks for the move.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from gpujobs.contract import container_name
from gpujobs.domain.spec import JobSpec
from gpujobs.domain.states import JobState, Reason, check_transition


class Market(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HistoryEntry(_Frozen):
    at: datetime
    source: JobState | None
    target: JobState
    reason: Reason
    attempt: int | None = None
    detail: str = ""


class LaunchTry(_Frozen):
    """One rung of the capacity ladder that was tried and refused."""

    at: datetime
    instance_type: str
    zone: str
    subnet_id: str
    market: Market
    error_code: str
    message: str = ""


class Attempt(_Frozen):
    """One launch of the whole gang. A job's attempts are numbered from 1."""

    number: int
    started_at: datetime
    instance_ids: tuple[str, ...] = ()
    instance_type: str | None = None
    zone: str | None = None
    subnet_id: str | None = None
    market: Market | None = None
    resume_from_step: int | None = None
    checkpoint_step: int | None = None
    """Newest checkpoint this attempt committed."""
    ended_at: datetime | None = None
    end_reason: str | None = None
    tries: tuple[LaunchTry, ...] = ()
    lease_expires_at: datetime | None = None
    """While LAUNCHING: until when the launcher that started this attempt owns it."""
    interrupted_at: datetime | None = None
    """When a spot warning (or a preempted exit) marked this attempt as being reclaimed."""
    exit_codes: dict[str, int] = Field(default_factory=dict)
    """Container exit code per instance id, as each node reported it (`Job Exited`)."""
    gone: tuple[str, ...] = ()
    """Instances seen stopping, stopped, shutting down or terminated."""
    gone_at: datetime | None = None
    """When the last of the attempt's instances was seen gone."""
    last_heartbeat_at: datetime | None = None
    heartbeat_step: int | None = None
    checkpoint_signalled_at: datetime | None = None

    @property
    def all_gone(self) -> bool:
        return bool(self.instance_ids) and set(self.instance_ids) <= set(self.gone)

    @property
    def all_reported(self) -> bool:
        return bool(self.instance_ids) and set(self.instance_ids) <= set(self.exit_codes)

    @property
    def pool(self) -> tuple[str, str, Market] | None:
        if self.instance_type and self.zone and self.market:
            return (self.instance_type, self.zone, self.market)
        return None

    def container_name(self, job_id: str) -> str:
        """The name the bootstrap gives the training container (the SSM signal addresses it)."""
        return container_name(job_id, self.number)

    @property
    def is_over(self) -> bool:
        return self.ended_at is not None

    def client_token(self, job_id: str, rung: int) -> str:
        """EC2 idempotency token: a retried RunInstances for the same rung never doubles instances."""
        return f"{job_id}-a{self.number}-r{rung}"


class StopRequest(_Frozen):
    """A policy asked the job to stop (idle, budget, runtime or cost cap). The instances go only
    once a checkpoint committed after `requested_at` is reported, or when `deadline` passes."""

    reason: Reason
    requested_at: datetime
    deadline: datetime
    checkpoint_step_at_request: int | None = None
    detail: str = ""
    executed_at: datetime | None = None
    """When the instances were terminated (spot) or stopped (on-demand) for this request."""


class Job(_Frozen):
    job_id: str
    state: JobState
    version: int = 0
    created_at: datetime
    updated_at: datetime
    spec: JobSpec | None = None
    """None only for REJECTED submissions."""
    name: str = ""
    team: str = "default"
    problems: tuple[str, ...] = ()
    """Validation messages of a REJECTED submission, one per problem, each naming its field."""
    submission_excerpt: str = ""
    history: tuple[HistoryEntry, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    interruptions: int = 0
    crashes: int = 0
    checkpoint_step: int | None = None
    """Newest committed checkpoint step over all attempts: where the next attempt resumes."""
    checkpoint_uri: str | None = None
    next_try_at: datetime | None = None
    hold_reason: str | None = None
    stop_request: StopRequest | None = None
    source_message_id: str | None = None
    status_detail: str = Field(default="", description="last human-readable word on this job")

    # ---- queries -------------------------------------------------------------------------
    @property
    def current_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def instance_ids(self) -> tuple[str, ...]:
        attempt = self.current_attempt
        return attempt.instance_ids if attempt and not attempt.is_over else ()

    @property
    def all_instance_ids(self) -> tuple[str, ...]:
        return tuple(i for a in self.attempts for i in a.instance_ids)

    def attempt(self, number: int) -> Attempt | None:
        return next((a for a in self.attempts if a.number == number), None)

    def attempt_of_instance(self, instance_id: str) -> Attempt | None:
        return next((a for a in reversed(self.attempts) if instance_id in a.instance_ids), None)

    def is_current(self, attempt: Attempt) -> bool:
        current = self.current_attempt
        return current is not None and current.number == attempt.number

    def require_spec(self) -> JobSpec:
        if self.spec is None:
            raise ValueError(f"job {self.job_id} has no spec (state {self.state})")
        return self.spec

    # ---- changes -------------------------------------------------------------------------
    def transition(
        self, target: JobState, reason: Reason, *, now: datetime, detail: str = "", **changes: object
    ) -> Job:
        check_transition(self.state, target, reason)
        attempt = self.current_attempt
        entry = HistoryEntry(
            at=now,
            source=self.state,
            target=target,
            reason=reason,
            attempt=attempt.number if attempt else None,
            detail=detail,
        )
        return self.model_copy(
            update={
                "state": target,
                "updated_at": now,
                "history": (*self.history, entry),
                "status_detail": detail or reason.value,
                **changes,
            }
        )

    def with_attempt(self, attempt: Attempt, *, now: datetime) -> Job:
        """Replace the attempt with the same number, or append it as a new one."""
        attempts = list(self.attempts)
        for index, existing in enumerate(attempts):
            if existing.number == attempt.number:
                attempts[index] = attempt
                break
        else:
            attempts.append(attempt)
        return self.model_copy(update={"attempts": tuple(attempts), "updated_at": now})

    @classmethod
    def submitted(cls, *, job_id: str, spec: JobSpec, now: datetime, message_id: str | None) -> Job:
        entry = HistoryEntry(at=now, source=None, target=JobState.QUEUED, reason=Reason.SUBMITTED)
        check_transition(None, JobState.QUEUED, Reason.SUBMITTED)
        return cls(
            job_id=job_id,
            state=JobState.QUEUED,
            created_at=now,
            updated_at=now,
            spec=spec,
            name=spec.name,
            team=spec.team,
            history=(entry,),
            source_message_id=message_id,
            status_detail="submitted",
        )

    @classmethod
    def rejected(cls, *, job_id: str, problems: list[str], excerpt: str, now: datetime, message_id: str | None) -> Job:
        check_transition(None, JobState.REJECTED, Reason.INVALID_SPEC)
        entry = HistoryEntry(
            at=now,
            source=None,
            target=JobState.REJECTED,
            reason=Reason.INVALID_SPEC,
            detail="; ".join(problems),
        )
        return cls(
            job_id=job_id,
            state=JobState.REJECTED,
            created_at=now,
            updated_at=now,
            problems=tuple(problems),
            submission_excerpt=excerpt[:1024],
            history=(entry,),
            source_message_id=message_id,
            status_detail="; ".join(problems)[:1024],
        )


def job_id_for(*, client_token: str | None, team: str | None, message_id: str | None) -> str:
    """A deterministic job id, so that a redelivered message or a resubmitted token maps to one job.

    With a client_token the id depends on (team, token); otherwise on the SQS message id, which
    SQS keeps across redeliveries of the same message.
    """
    if client_token:
        key = f"token:{team or 'default'}:{client_token}"
    elif message_id:
        key = f"message:{message_id}"
    else:
        raise ValueError("a job id needs a client_token or a message id")
    return "j-" + hashlib.sha256(key.encode()).hexdigest()[:16]
