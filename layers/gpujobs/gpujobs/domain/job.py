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

import hashlib
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gpujobs.contract import container_name
from gpujobs.domain.spec import JobSpec
from gpujobs.domain.states import WAITING_FOR_ROOM, JobState, Reason, check_transition

MAX_DETAIL_CHARS = 400
"""Longest free text kept (EC2's capacity messages run to about 300 characters)."""
MAX_HISTORY_KEPT = 40
MAX_ATTEMPTS_KEPT = 4
"""Finished attempts kept in full besides any unfinished one; older ones become `RetiredAttempts`."""
MAX_TRIES_KEPT = 12
"""Refused rungs kept per attempt: the newest, which say why the latest walk found nothing."""
MAX_PROBLEMS_KEPT = 20
BOOT_ALLOWANCE = timedelta(minutes=8)
"""Launch to training: p3/p4 provisioning (about 4 min) plus a multi-GB image pull (the goodput bench)."""
RESTORE_ALLOWANCE = timedelta(minutes=1)
"""Loading the newest checkpoint onto the GPUs."""
COMPLETED_END_REASON = "succeeded"
"""The `end_reason` of an attempt whose nodes all exited 0 (`fate.Verdict.SUCCEEDED`)."""


def cap_detail(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"


Detail = Annotated[str, AfterValidator(cap_detail)]


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
    detail: Detail = ""


class LaunchTry(_Frozen):
    """One rung of the capacity ladder that was tried and refused."""

    at: datetime
    instance_type: str
    zone: str
    subnet_id: str
    market: Market
    error_code: str
    message: Detail = ""


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
    checkpoint_at: datetime | None = None
    """When `checkpoint_step` was recorded: the attempt's work up to then is kept, the rest is redone."""
    ended_at: datetime | None = None
    end_reason: str | None = None
    tries: tuple[LaunchTry, ...] = ()
    tries_dropped: int = 0
    """Refusals older than the newest `MAX_TRIES_KEPT`, counted but no longer kept."""
    lease_expires_at: datetime | None = None
    """While LAUNCHING: until when the launcher that started this attempt owns it."""
    interrupted_at: datetime | None = None
    """When a spot warning (or a preempted exit) marked this attempt as being reclaimed."""
    moved: bool = False
    """Interrupted by a deadline's move, not by EC2: it trains on until its replacement's gang is up."""
    exit_codes: dict[str, int] = Field(default_factory=dict)
    """Container exit code per instance id, as each node reported it (`Job Exited`)."""
    error_line: Detail = ""
    """The message of the attempt's first failed exit report (say, the trainer's configuration
    error), capped: what `gpujobs status` shows of why the attempt failed."""
    gone: tuple[str, ...] = ()
    """Instances seen stopping, stopped, shutting down or terminated."""
    gone_at: datetime | None = None
    """When the last of the attempt's instances was seen gone."""
    first_gone_at: datetime | None = None
    """When the first of them was: a node gone without a report breaks the gang after a grace."""
    gone_reasons: dict[str, str] = Field(default_factory=dict)
    """EC2's state reason per instance seen gone (DescribeInstances `StateReason`), when it gave one."""
    last_heartbeat_at: datetime | None = None
    heartbeat_step: int | None = None
    checkpoint_signalled_at: datetime | None = None
    idle_detection_off_at: datetime | None = None
    """When the reconciler found this attempt's idle alarms fed no GPU metric (`domain.idle_detection`)."""

    @property
    def all_gone(self) -> bool:
        return bool(self.instance_ids) and set(self.instance_ids) <= set(self.gone)

    @property
    def all_reported(self) -> bool:
        return bool(self.instance_ids) and set(self.instance_ids) <= set(self.exit_codes)

    @property
    def useful_instance_seconds(self) -> float:
        """Instance-seconds whose work was kept: up to the end of an attempt that completed the job,
        else up to its newest committed checkpoint (work after it is redone by the next attempt)."""
        kept_until = self.ended_at if self.end_reason == COMPLETED_END_REASON else self.checkpoint_at
        if not self.instance_ids or kept_until is None:
            return 0.0
        return max(0.0, (kept_until - self.started_at).total_seconds()) * len(self.instance_ids)

    @property
    def trains_from(self) -> datetime:
        """When its training begins, once it has booted and restored (`BOOT_ALLOWANCE`, `RESTORE_ALLOWANCE`)."""
        return self.started_at + BOOT_ALLOWANCE + RESTORE_ALLOWANCE

    @property
    def trained_to_sync(self) -> timedelta:
        """Training kept by its newest commit or sync: from `trains_from` up to that (`deadline.time_trained`)."""
        kept = self.checkpoint_at - self.trains_from if self.checkpoint_at is not None else timedelta(0)
        return max(timedelta(0), kept)

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

    def client_token(self, job_id: str, *, instance_type: str, subnet_id: str, market: Market) -> str:
        """EC2 idempotency token for launching this attempt into one pool (type, subnet, market).

        Derived from the pool, not from the rung's position in the ladder: a takeover whose ladder
        is ordered differently (a reclaimed pool moved last, on-demand removed by a forecast, a
        subnet added) still sends a pool the token it was sent before, so a retry can never send a
        token EC2 remembers with another pool's parameters. The subnet, not just its zone, because
        two subnets of one zone are two requests. At most 64 ASCII characters, as EC2 requires.
        """
        pool = hashlib.sha256(f"{instance_type}|{subnet_id}|{market.value}".encode()).hexdigest()[:16]
        return f"{job_id}-a{self.number}-{pool}"


class PoolUsage(_Frozen):
    """Instance-seconds a job's retired attempts spent in one pool."""

    instance_type: str
    zone: str | None
    market: Market
    instance_seconds: float
    useful_instance_seconds: float = 0.0
    """The part of `instance_seconds` whose work was kept (`Attempt.useful_instance_seconds`)."""


class RetiredAttempts(_Frozen):
    """What the attempts dropped from the record held, so runtime and cost caps still count them."""

    count: int = 0
    runtime_seconds: float = 0.0
    """Wall time the retired attempts held instances."""
    usage: tuple[PoolUsage, ...] = ()
    no_capacity_in_a_row: int = 0
    """How many of the newest retired attempts found no capacity (or no quota), so the retry backoff keeps growing."""
    boot_deaths_in_a_row: int = 0
    """Newest retired attempts in a row that saw their instances die at boot (`fate.boot_deaths_in_a_row`)."""
    progressed: bool = False
    """Whether any retired attempt heartbeated or committed a checkpoint (`fate.made_progress`)."""
    trained_seconds: float = 0.0
    """What the retired attempts' commits or syncs kept of training (`Attempt.trained_to_sync`)."""

    def including(self, attempt: Attempt) -> RetiredAttempts:
        in_a_row = self.no_capacity_in_a_row + 1 if attempt.end_reason in WAITING_FOR_ROOM else 0
        heard = attempt.last_heartbeat_at is not None or attempt.checkpoint_step is not None
        progressed = self.progressed or heard
        trained = self.trained_seconds + attempt.trained_to_sync.total_seconds()
        if not attempt.instance_ids or attempt.ended_at is None:
            update = {"count": self.count + 1, "no_capacity_in_a_row": in_a_row, "progressed": progressed}
            return self.model_copy(update={**update, "trained_seconds": trained})
        boot_deaths = self.boot_deaths_in_a_row + 1 if attempt.end_reason == Reason.DIED_AT_BOOT.value else 0
        held = (attempt.ended_at - attempt.started_at).total_seconds()
        market = attempt.market or Market.ON_DEMAND
        pool = (attempt.instance_type or "", attempt.zone, market)
        usage = list(self.usage)
        spent, useful = held * len(attempt.instance_ids), attempt.useful_instance_seconds
        for index, known in enumerate(usage):
            if (known.instance_type, known.zone, known.market) == pool:
                usage[index] = known.model_copy(
                    update={
                        "instance_seconds": known.instance_seconds + spent,
                        "useful_instance_seconds": known.useful_instance_seconds + useful,
                    }
                )
                break
        else:
            usage.append(
                PoolUsage(
                    instance_type=pool[0],
                    zone=pool[1],
                    market=market,
                    instance_seconds=spent,
                    useful_instance_seconds=useful,
                )
            )
        return RetiredAttempts(
            count=self.count + 1,
            runtime_seconds=self.runtime_seconds + held,
            usage=tuple(usage),
            no_capacity_in_a_row=in_a_row,
            boot_deaths_in_a_row=boot_deaths,
            progressed=progressed,
            trained_seconds=trained,
        )

    @property
    def runtime(self) -> timedelta:
        return timedelta(seconds=self.runtime_seconds)

    @property
    def trained(self) -> timedelta:
        return timedelta(seconds=self.trained_seconds)


class StopRequest(_Frozen):
    """A policy asked the job to stop (idle, budget, runtime or cost cap). The instances go only
    once a checkpoint committed after `requested_at` is reported, or when `deadline` passes."""

    reason: Reason
    requested_at: datetime
    deadline: datetime
    checkpoint_step_at_request: int | None = None
    detail: Detail = ""
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
