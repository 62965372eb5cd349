"""The Job aggregate: its state, its history of transitions and its attempts.

A Job is an immutable value. Every change returns a new Job whose `version` is unchanged: the store
bumps the version when it saves, conditional on the version it read, so two writers can never both
win. Only `transition()` moves the state, and it asks `states.check_transition` first, so the
state machine is enforced in one place whatever code path asks for the move.

The record is one DynamoDB item, and an item cannot pass 400 KB. A job may wait weeks for capacity
(a new attempt with a ladder's worth of refusals every few minutes) or be interrupted a hundred times,
so the record keeps only the newest `MAX_HISTORY_KEPT` transitions, `MAX_ATTEMPTS_KEPT` finished
attempts and `MAX_TRIES_KEPT` refusals per attempt, with counts of what it let go; every free-text
detail is capped at `MAX_DETAIL_CHARS`. What the runtime and cost caps need of a retired attempt
(how long it held how many instances of which pool) is folded into `RetiredAttempts` first.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gpujobs.domain.attempts import (
    BOOT_ALLOWANCE,
    COMPLETED_END_REASON,
    RESTORE_ALLOWANCE,
    Attempt,
    Kept,
    LaunchTry,
    PoolUsage,
    Regroup,
    RetiredAttempts,
)
from gpujobs.domain.progress import Progress
from gpujobs.domain.spec import JobSpec
from gpujobs.domain.states import JobState, Reason, check_transition
from gpujobs.domain.values import MAX_DETAIL_CHARS, Admission, Detail, Frozen, Ledgered, Market, cap_detail

__all__ = [
    "BOOT_ALLOWANCE",
    "COMPLETED_END_REASON",
    "MAX_DETAIL_CHARS",
    "RESTORE_ALLOWANCE",
    "Admission",
    "Attempt",
    "Detail",
    "HistoryEntry",
    "Job",
    "Kept",
    "LaunchTry",
    "Ledgered",
    "Market",
    "PoolUsage",
    "Regroup",
    "RetiredAttempts",
    "StopRequest",
    "cap_detail",
]

MAX_HISTORY_KEPT = 40
MAX_ATTEMPTS_KEPT = 4
"""Finished attempts kept in full besides any unfinished one; older ones become `RetiredAttempts`."""
MAX_TRIES_KEPT = 12
"""Refused rungs kept per attempt: the newest, which say why the latest walk found nothing."""
MAX_PROBLEMS_KEPT = 20


class HistoryEntry(Frozen):
    at: datetime
    source: JobState | None
    target: JobState
    reason: Reason
    attempt: int | None = None
    detail: Detail = ""


class StopRequest(Frozen):
    """A policy asked the job to stop (idle, budget, runtime or cost cap). The instances go only
    once a checkpoint committed after `requested_at` is reported, or when `deadline` passes."""

    reason: Reason
    requested_at: datetime
    deadline: datetime
    checkpoint_step_at_request: int | None = None
    detail: Detail = ""
    executed_at: datetime | None = None
    """When the instances were terminated (spot) or stopped (on-demand) for this request."""


class Job(Frozen):
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
    history_dropped: int = 0
    """Transitions older than the newest `MAX_HISTORY_KEPT`, counted but no longer kept."""
    attempts: tuple[Attempt, ...] = ()
    retired: RetiredAttempts = RetiredAttempts()
    interruptions: int = 0
    crashes: int = 0
    checkpoint_step: int | None = None
    """Newest committed checkpoint step over all attempts: where the next attempt resumes."""
    checkpoint_uri: str | None = None
    next_try_at: datetime | None = None
    hold_reason: str | None = None
    stop_request: StopRequest | None = None
    source_message_id: str | None = None
    status_detail: Detail = Field(default="", description="last human-readable word on this job")
    objects_deleted_at: datetime | None = None
    """When the reconciler deleted the ended job's objects under its prefix (`domain.retention`)."""
    counted: bool = False
    """In the GPU ledger (`domain.ledger`): every job submitted since quotas exist, and older active
    jobs once the reconciler enrolled them. Only counted jobs wait for admission or hold GPUs."""
    admission: Admission | None = None
    """Its share of its team's GPU quota, from admission until it ends or is preempted."""
    progress: Progress = Progress()
    """What its training reported as it ran: newest step, metrics and throughput, and a bounded series."""
    ledgered: Ledgered = Field(default_factory=Ledgered)
    """What the GPU ledger counts for this record as last written (`domain.ledger.change_of`)."""
    kept: Kept | None = None
    """A FAILED job's last gang, kept up for inspection (`domain.keep`); None: nothing kept."""

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

    @property
    def attempt_count(self) -> int:
        """Attempts ever started, retired ones included (attempts are numbered from 1)."""
        return self.attempts[-1].number if self.attempts else self.retired.count

    @property
    def history_count(self) -> int:
        """Transitions ever recorded, dropped ones included."""
        return self.history_dropped + len(self.history)

    def history_since(self, before: Job | None) -> tuple[HistoryEntry, ...]:
        """The transitions this job has that `before` (an earlier read of it) had not."""
        new = self.history_count - (before.history_count if before else 0)
        return self.history[max(0, len(self.history) - new) :] if new > 0 else ()

    def attempt(self, number: int) -> Attempt | None:
        return next((a for a in self.attempts if a.number == number), None)

    def attempt_of_instance(self, instance_id: str) -> Attempt | None:
        return next((a for a in reversed(self.attempts) if instance_id in a.instance_ids), None)

    def held_until(self, attempt: Attempt, now: datetime) -> datetime:
        """Until when the attempt's instances were (or are, as of `now`) held and billed: its end, or
        for a gang kept for inspection, the end of the keep."""
        end = attempt.ended_at or now
        if self.kept is not None and self.kept.attempt == attempt.number:
            end = max(end, min(now, self.kept.ends_at))
        return end

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
                "status_detail": cap_detail(detail or reason.value),
                **changes,
            }
        )._bounded()

    def with_attempt(self, attempt: Attempt, *, now: datetime) -> Job:
        """Replace the attempt with the same number, or append it as a new one."""
        attempts = list(self.attempts)
        for index, existing in enumerate(attempts):
            if existing.number == attempt.number:
                attempts[index] = attempt
                break
        else:
            attempts.append(attempt)
        return self.model_copy(update={"attempts": tuple(attempts), "updated_at": now})._bounded()

    def _bounded(self) -> Job:
        """This job with its history, attempts and tries cut to what the record keeps."""
        changes: dict[str, object] = {}
        if len(self.history) > MAX_HISTORY_KEPT:
            drop = len(self.history) - MAX_HISTORY_KEPT
            changes.update(history=self.history[drop:], history_dropped=self.history_dropped + drop)
        kept: list[Attempt] = []
        retired, cut = self.retired, False
        finished = sum(1 for a in self.attempts if a.is_over)
        for attempt in self.attempts:
            if attempt.is_over and finished > MAX_ATTEMPTS_KEPT:
                retired, finished, cut = retired.including(attempt), finished - 1, True
                continue
            if len(attempt.tries) > MAX_TRIES_KEPT:
                drop = len(attempt.tries) - MAX_TRIES_KEPT
                attempt = attempt.model_copy(  # noqa: PLW2901 - the kept, shortened attempt
                    update={"tries": attempt.tries[drop:], "tries_dropped": attempt.tries_dropped + drop}
                )
                cut = True
            kept.append(attempt)
        if cut:
            changes.update(attempts=tuple(kept), retired=retired)
        return self.model_copy(update=changes) if changes else self

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
            counted=True,
        )

    @classmethod
    def rejected(cls, *, job_id: str, problems: list[str], excerpt: str, now: datetime, message_id: str | None) -> Job:
        check_transition(None, JobState.REJECTED, Reason.INVALID_SPEC)
        if len(problems) > MAX_PROBLEMS_KEPT:
            more = len(problems) - MAX_PROBLEMS_KEPT
            problems = [*problems[:MAX_PROBLEMS_KEPT], f"... and {more} more problem(s)"]
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
            problems=tuple(cap_detail(p) for p in problems),
            submission_excerpt=excerpt[:1024],
            history=(entry,),
            source_message_id=message_id,
            status_detail="; ".join(problems),
        )
