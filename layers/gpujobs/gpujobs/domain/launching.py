"""Pure decisions of the launch lifecycle: claim a launch, record (or abandon) its gang, end it, cancel.

The launcher walks the capacity ladder outside any write; these functions decide what the record
says before and after that walk. A launcher whose write loses a race (to a heartbeat, a checkpoint
report, a takeover) decides again on the fresh record: as long as it is still the same attempt the
gang is recorded, and only when the job has moved on are the instances it started terminated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from gpujobs.domain.decisions import settle
from gpujobs.domain.effects import (
    CreateAlarms,
    Decision,
    DeleteAlarms,
    Effect,
    Launch,
    Outcome,
    Terminate,
    TerminateJobInstances,
    ignore,
)
from gpujobs.domain.job import Admission, Attempt, Job, LaunchTry, Market, cap_detail
from gpujobs.domain.keep import release
from gpujobs.domain.ledger import holds, off_the_ledger, waits
from gpujobs.domain.states import JobState, Reason

V = TypeVar("V")

LAUNCH_LEASE = timedelta(minutes=11)
"""How long a launcher owns a LAUNCHING attempt before a retry may take it over.

Longer than any launching function's timeout (Submit: 600 s), so a launcher still walking the
ladder is never taken over by a second one (a walk stops short of its invocation's deadline and
gives the lease up, `pause_launch`); shorter than the queue's visibility timeout (3600 s),
so a message redelivered after a crashed launch finds the lease expired and finishes the launch
(adopting any instances the crashed one started). A launch that fails cleanly releases it at once.
A launcher that knows its invocation's deadline holds it no longer than that (`invocation_lease`).
"""
LEASE_MARGIN = timedelta(seconds=30)
"""Past its invocation's deadline a launcher is dead (Lambda ends it there); the margin covers the
clocks of the writers, which all read the same NTP-synced wall clock, and the walk's last write."""


def invocation_lease(time_left: timedelta | None) -> timedelta:
    """The lease a launcher takes: until its invocation's deadline (and `LEASE_MARGIN`), never longer
    than `LAUNCH_LEASE`. A walk killed mid-way (its function timed out, ran out of memory, crashed)
    then holds the job only that long: the next reconciler tick after it takes the launch over,
    not the one 11 minutes later. With no deadline known (a test, a script), `LAUNCH_LEASE`."""
    if time_left is None:
        return LAUNCH_LEASE
    return min(LAUNCH_LEASE, max(time_left, timedelta(0)) + LEASE_MARGIN)


@dataclass(frozen=True)
class Gang:
    """The instances one RunInstances call (or an adoption) produced, in launch-index order."""

    instance_ids: tuple[str, ...]
    instance_type: str
    zone: str
    market: Market
    subnet_id: str | None


def wants_idle_alarms(job: Job) -> bool:
    """GPU jobs get an idle alarm per instance (CPU smoke jobs have no GPU metric to watch)."""
    return job.spec is not None and job.spec.gpus_per_node > 0


def claim_launch(
    job: Job,
    *,
    now: datetime,
    hold: str | None,
    lease: timedelta = LAUNCH_LEASE,
    admission: Admission | None = None,
) -> Decision:
    """Take a launch the job is due, or hold it (`hold`: the budget's reason to launch nothing), for
    `lease` (`invocation_lease`: what the claiming invocation has left). A job that waits for
    admission (`ledger.waits`) is claimed only with the `admission` it was just granted, which the
    same write records (`domain.admission.admit_at_once`); a budget hold holds it all the same."""
    if waits(job) and hold is None:
        if admission is None:
            return ignore(Outcome.NOT_ADMITTED)
        # admitted at once, as the claim: the launch's own transition says so, no entry of its own
        job = job.model_copy(update={"admission": admission, "hold_reason": None})
    attempt = job.current_attempt
    if job.state is JobState.QUEUED:
        if job.next_try_at and job.next_try_at > now:
            return ignore(Outcome.NOT_DUE)
        reason = Reason.LAUNCH_STARTED
    elif job.state is JobState.INTERRUPTED:
        reason = Reason.REPLACEMENT_LAUNCHING
    elif job.state is JobState.LAUNCHING and attempt and attempt.lease_expires_at and attempt.lease_expires_at <= now:
        reason = Reason.LAUNCH_STARTED
    else:
        return ignore(Outcome.NOT_DUE)
    if hold is not None:
        if job.state is JobState.QUEUED and job.hold_reason == hold:
            return ignore(Outcome.NOT_DUE)
        held = job
        if job.state is JobState.LAUNCHING and attempt is not None:
            ended = attempt.model_copy(update={"ended_at": now, "end_reason": Reason.BUDGET_HOLD.value})
            held = job.with_attempt(ended, now=now)
        held = held.transition(JobState.QUEUED, Reason.BUDGET_HOLD, now=now, detail=hold, hold_reason=hold)
        return Decision(Outcome.LAUNCH_HELD, held, detail=hold)
    if job.state is JobState.LAUNCHING and attempt is not None:
        renewed = attempt.model_copy(update={"lease_expires_at": now + lease})
        return Decision(Outcome.LAUNCH_CLAIMED, job.with_attempt(renewed, now=now), detail="launch taken over")
    fresh = Attempt(
        number=job.attempt_count + 1,
        started_at=now,
        resume_from_step=job.checkpoint_step,
        lease_expires_at=now + lease,
    )
    # A new attempt starts clean: a stop requested of an earlier one is not its to carry out.
    claimed = job.with_attempt(fresh, now=now).transition(
        JobState.LAUNCHING, reason, now=now, next_try_at=None, hold_reason=None, stop_request=None
    )
    return Decision(Outcome.LAUNCH_CLAIMED, claimed, detail=f"attempt {fresh.number}")


def admitted(job: Job, admission: Admission, *, now: datetime) -> Job:
    """The waiting job with its admission (QUEUED -> QUEUED, admitted): due its launch."""
    return job.transition(
        JobState.QUEUED,
        Reason.ADMITTED,
        now=now,
        detail=f"admitted: {admission.detail}",
        admission=admission,
        hold_reason=None,
        next_try_at=None,
    )


def admit(job: Job, admission: Admission, *, now: datetime) -> Decision:
    """Grant a waiting job its admission (the reconciler's plan, `domain.admission.plan`)."""
    if not waits(job):
        return ignore(Outcome.ALREADY_HANDLED, "no longer waits for admission")
    granted = admitted(job, admission, now=now)
    return Decision(Outcome.ADMITTED, granted, (Launch(job.job_id),), granted.status_detail)


def wait_for_admission(job: Job, *, blocked: str, detail: str, now: datetime) -> Decision:
    """Say why a job waits for admission, once per reason (the numbers are `gpujobs queue`'s, live)."""
    if not waits(job) or (job.hold_reason or "").startswith(blocked):
        return ignore(Outcome.NOT_ADMITTED)
    return Decision(
        Outcome.ADMISSION_WAITS,
        job.transition(JobState.QUEUED, Reason.ADMISSION_WAIT, now=now, detail=detail, hold_reason=detail),
        detail=detail,
    )


def requeue_preempted(job: Job, *, now: datetime, detail: str) -> Decision:
    """A job that holds borrowed GPUs but has no gang up gives them back at once and waits again."""
    if not holds(job) or job.state is not JobState.QUEUED:
        return ignore(Outcome.ALREADY_HANDLED, "no longer a queued holder")
    back = job.transition(JobState.QUEUED, Reason.PREEMPTED, now=now, detail=detail, admission=None)
    return Decision(Outcome.PREEMPTED, back, detail=detail)


def enroll(job: Job, *, now: datetime) -> Decision:
    """Count a job of a release before the ledger: a job past its admission (launching, running,
    being replaced, or queued after a launch) holds its GPUs as it does; one never launched waits."""
    if job.counted or job.state.is_terminal or job.spec is None:
        return ignore(Outcome.ALREADY_HANDLED)
    launched = job.state is not JobState.QUEUED or job.attempt_count > 0
    grandfathered = Admission(at=now, detail="held since before GPU quotas were counted") if launched else None
    counted = job.model_copy(update={"counted": True, "admission": grandfathered, "updated_at": now})
    return Decision(Outcome.ENROLLED, counted, detail="counted in the GPU ledger")


def settle_ledger(job: Job) -> Decision:
    """Write the record as it is, so that the ledger counts what it stands for (`ledger.off_the_ledger`)."""
    if not off_the_ledger(job):
        return ignore(Outcome.ALREADY_HANDLED)
    return Decision(Outcome.LEDGER_SETTLED, job, detail="counted in the GPU ledger again")


def record_launch(
    job: Job, *, attempt_number: int, gang: Gang, tries: tuple[LaunchTry, ...], now: datetime
) -> Decision:
    """Record the gang on its attempt (RUNNING), or terminate it if the job no longer wants it."""
    attempt = job.attempt(attempt_number)
    if attempt is not None and set(attempt.instance_ids) == set(gang.instance_ids):
        return ignore(Outcome.ALREADY_HANDLED, "the gang is already recorded")
    if attempt is None or attempt.is_over or not job.is_current(attempt) or job.state is not JobState.LAUNCHING:
        # Cancelled or held while we launched: the instances must not outlive a job that does not want them.
        return Decision(Outcome.LAUNCH_ABANDONED, effects=(Terminate(gang.instance_ids),))
    updated = attempt.model_copy(
        update={
            "instance_ids": gang.instance_ids,
            "instance_type": gang.instance_type,
            "zone": gang.zone,
            "subnet_id": gang.subnet_id,
            "market": gang.market,
            "tries": tries,
            "lease_expires_at": None,
            "exit_codes": _by_instance(attempt.exit_codes, gang.instance_ids),
            "unhealthy": _by_instance(attempt.unhealthy, gang.instance_ids),
            "slow_interconnect": _by_instance(attempt.slow_interconnect, gang.instance_ids),
            "can_regroup": True,
        }
    )
    detail = f"{len(gang.instance_ids)} x {gang.instance_type} {gang.market} in {gang.zone}"
    recorded = job.with_attempt(updated, now=now).transition(
        JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=now, detail=detail
    )
    effects: tuple[Effect, ...] = ()
    spec = job.require_spec()
    if wants_idle_alarms(job):
        below, minutes = spec.idle.gpu_util_below_percent, spec.idle.for_minutes
        effects = (CreateAlarms(job.job_id, gang.instance_ids, below, minutes),)
    launched = Decision(Outcome.LAUNCHED, recorded, effects, detail)
    return launched.then(settle(recorded, now=now)) if updated.exit_codes else launched


def _by_instance(reported: dict[str, V], instance_ids: tuple[str, ...]) -> dict[str, V]:
    """What exit reports that overtook the launch's record said (codes, unhealthy findings), keyed
    by rank or id, mapped onto the gang."""
    found: dict[str, V] = {}
    for key, value in reported.items():
        rank = int(key.removeprefix("rank:")) if key.startswith("rank:") else None
        instance_id = instance_ids[rank] if rank is not None and rank < len(instance_ids) else key
        if instance_id in instance_ids:
            found.setdefault(instance_id, value)
    return found


def end_launch(
    job: Job,
    *,
    attempt_number: int,
    tries: tuple[LaunchTry, ...],
    target: JobState,
    reason: Reason,
    detail: str,
    next_try_at: datetime | None,
    now: datetime,
) -> Decision:
    """No rung had capacity (QUEUED, to retry later) or EC2 refused for good (FAILED)."""
    attempt = job.current_attempt
    if attempt is None or attempt.number != attempt_number or attempt.is_over or job.state is not JobState.LAUNCHING:
        return ignore(Outcome.ALREADY_HANDLED, "the launch was taken over or the job moved on")
    if target is JobState.QUEUED:
        kept = moved_attempt_trains_on(job, now=now, detail=detail)
        if kept is not None:
            return Decision(Outcome.LAUNCH_ENDED, kept, detail=kept.status_detail)
    ended = attempt.model_copy(
        update={"tries": tries, "ended_at": now, "end_reason": reason.value, "lease_expires_at": None}
    )
    changes: dict[str, object] = {"next_try_at": next_try_at} if target is JobState.QUEUED else {}
    moved = job.with_attempt(ended, now=now).transition(target, reason, now=now, detail=detail, **changes)
    return Decision(Outcome.LAUNCH_ENDED, moved, detail=detail)


def moved_attempt_trains_on(job: Job, *, now: datetime, detail: str) -> Job | None:
    """A move whose replacement found no room gives the job back its moved attempt.

    A move (`deadline.move_market`, `volatility.back_to_spot`) is voluntary: the attempt it left
    still trains (its save was a checkpoint, not a stop) until the reconciler takes its instances
    after the warning window. When the replacement's walk launched nowhere, that attempt is current
    again and RUNNING (the replacement, which launched nothing, is dropped, its number given to the
    next one), rather than the job waiting QUEUED with nothing running. None when the launch was no
    such move, or the moved attempt has ended or lost an instance meanwhile: then the job waits as
    any other.
    """
    if len(job.attempts) < 2:
        return None
    moved, replacement = job.attempts[-2], job.attempts[-1]
    if not moved.moved or moved.is_over or not moved.instance_ids or moved.gone or replacement.instance_ids:
        return None
    from gpujobs.domain.volatility import move_reason  # a launch's only: no handler's cold start loads it

    back = moved.model_copy(update={"interrupted_at": None, "moved": False})
    kept = job.model_copy(update={"attempts": (*job.attempts[:-2], back)})
    reason = move_reason(job)
    if reason is Reason.BACK_TO_SPOT:
        market = "spot"
    elif moved.market is None:
        market = "the other market"
    else:
        market = f"the market the deadline wanted (not {moved.market.value})"
    why = f"no room on {market}: attempt {moved.number} trains on ({detail})"
    return kept.transition(JobState.RUNNING, reason, now=now, detail=why)


def pause_launch(
    job: Job, *, attempt_number: int, tries: tuple[LaunchTry, ...], now: datetime, detail: str
) -> Decision:
    """A walk cut short by its invocation's deadline: keep the rungs it tried and give the lease up
    at once, so whichever launch comes next (the reconciler's next tick) takes the attempt over and
    walks only the rungs not yet tried. Still LAUNCHING: nothing was refused for good."""
    attempt = job.current_attempt
    if attempt is None or attempt.number != attempt_number or attempt.is_over or job.state is not JobState.LAUNCHING:
        return ignore(Outcome.ALREADY_HANDLED, "the launch was taken over or the job moved on")
    paused = attempt.model_copy(update={"tries": tries, "lease_expires_at": now})
    recorded = job.with_attempt(paused, now=now).model_copy(update={"status_detail": cap_detail(detail)})
    return Decision(Outcome.LAUNCH_PAUSED, recorded, detail=detail)


def cancel(job: Job, *, now: datetime) -> Decision:
    """Cancel the job and take every instance and alarm it still has; cancelling twice is harmless."""
    effects: tuple[Effect, ...] = (TerminateJobInstances(job.job_id),)
    if job.all_instance_ids:
        effects += (DeleteAlarms(job.all_instance_ids),)
    if job.state.is_terminal:
        released = release(job, now=now)  # a FAILED job's gang kept for inspection goes now
        return released or Decision(Outcome.ALREADY_HANDLED, effects=effects, detail=f"already {job.state.value}")
    cancelled = job
    attempt = job.current_attempt
    if attempt and not attempt.is_over:
        ended = attempt.model_copy(update={"ended_at": now, "end_reason": Reason.USER_CANCELLED.value})
        cancelled = job.with_attempt(ended, now=now)
    cancelled = cancelled.transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=now)
    return Decision(Outcome.CANCELLED, cancelled, effects)
