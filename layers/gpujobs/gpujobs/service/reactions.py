"""Reacting to the cloud: spot warnings, instance fate, trainer reports, idle GPUs, policy stops.

Every reaction has the same shape as the core's use cases: load the job (by instance id through
the store's index when the event carries no tags), record the observation on the job, save it
conditionally, then act (signal, terminate, launch) and publish. Observations are recorded before
anything is decided, and `settle()` decides from the whole record with the pure judgement in
`domain.fate`, so an event that arrives twice, late or out of order changes nothing the second
time, and the reconciler can call `settle()` at any moment with the same result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from gpujobs.contract import GONE_STATES
from gpujobs.domain.fate import (
    STOP_CHECKPOINT_DEADLINE,
    Verdict,
    interruption_moves,
    judge_attempt,
    moves_for,
    stop_is_due,
)
from gpujobs.domain.job import Attempt, Job, Market, StopRequest
from gpujobs.domain.spec import IdleAction
from gpujobs.domain.states import JobState, Reason
from gpujobs.service.jobs import MAX_RACE_RETRIES, JobService
from gpujobs.service.ports import ConcurrentUpdateError, JobNotFoundError, Signaller

log = logging.getLogger(__name__)

REBALANCE_SIGNAL_INTERVAL = timedelta(minutes=5)


@dataclass(frozen=True)
class Reaction:
    """What a handler logs and counts: the job concerned (if any) and what happened to it."""

    outcome: str
    job: Job | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def ignored(self) -> bool:
        return self.outcome.startswith("ignored")


Mutation = Callable[[Job], Job | None]
Effect = Callable[[], None]


@dataclass
class Reactions:
    jobs: JobService
    signaller: Signaller

    # ---- plumbing -------------------------------------------------------------------------
    @property
    def now(self) -> datetime:
        return self.jobs.clock.now()

    def _change(self, job_id: str, mutate: Mutation) -> tuple[Job, Job]:
        """Apply `mutate` to the stored job and save it conditionally, retrying lost races.

        Returns (before, after); `after is before` when the mutation had nothing to change.
        """
        for _ in range(MAX_RACE_RETRIES):
            before = self.jobs.store.get(job_id)
            after = mutate(before)
            if after is None:
                return before, before
            try:
                saved = self.jobs.store.save(after)
            except ConcurrentUpdateError:
                continue
            self.jobs.publish_changes(before, saved)
            return before, saved
        raise ConcurrentUpdateError(job_id, -1)

    def _job_of_instance(self, instance_id: str) -> Job | None:
        return self.jobs.store.find_by_instance(instance_id)

    # ---- spot -----------------------------------------------------------------------------
    def spot_warning(self, instance_id: str, *, action: str = "terminate") -> Reaction:
        """Checkpoint now, and launch the replacement at once in another pool."""
        job = self._job_of_instance(instance_id)
        if job is None:
            return not_ours(instance_id)
        now = self.now

        def mark(job: Job) -> Job | None:
            attempt = running_attempt(job, instance_id)
            if attempt is None or attempt.interrupted_at is not None:
                return None
            marked = job.with_attempt(attempt.model_copy(update={"interrupted_at": now}), now=now)
            move = interruption_moves(job)
            for target, reason in move.steps:
                marked = marked.transition(
                    target,
                    reason,
                    now=now,
                    detail=f"spot {action} warning for {instance_id}",
                    interruptions=job.interruptions + 1,
                )
            return marked

        before, after = self._change(job.job_id, mark)
        if after is before:
            return Reaction(f"ignored: the attempt of {instance_id} is already interrupted, replaced or over", after)
        attempt = after.attempt_of_instance(instance_id)
        assert attempt is not None
        self._signal(attempt, after.job_id)
        if after.state is JobState.INTERRUPTED:
            after = self.jobs.launch(after.job_id)
        return Reaction("interrupted", after, {"SpotInterruptions": 1})

    def rebalance(self, instance_id: str) -> Reaction:
        """A proactive checkpoint; no relaunch unless a warning follows."""
        job = self._job_of_instance(instance_id)
        if job is None:
            return not_ours(instance_id)
        now = self.now

        def note(job: Job) -> Job | None:
            attempt = running_attempt(job, instance_id)
            if attempt is None:
                return None
            last = attempt.checkpoint_signalled_at
            if last is not None and now - last < REBALANCE_SIGNAL_INTERVAL:
                return None
            return job.with_attempt(attempt.model_copy(update={"checkpoint_signalled_at": now}), now=now)

        before, after = self._change(job.job_id, note)
        if after is before:
            return Reaction("ignored: no running attempt to checkpoint, or signalled moments ago", after)
        attempt = after.attempt_of_instance(instance_id)
        assert attempt is not None
        self._signal(attempt, after.job_id)
        return Reaction("checkpoint requested", after, {"RebalanceCheckpoints": 1})

    def _signal(self, attempt: Attempt, job_id: str) -> None:
        live = [i for i in attempt.instance_ids if i not in attempt.gone]
        try:
            self.signaller.checkpoint_now(instance_ids=live, container=attempt.container_name(job_id))
        except Exception:
            log.warning("checkpoint signal to %s failed", live, exc_info=True)

    # ---- reports from the training container ------------------------------------------------
    def checkpoint_committed(self, *, job_id: str, attempt: int, step: int, uri: str) -> Reaction:
        """Moves the newest checkpoint forward only; may complete a pending policy stop."""
        now = self.now

        def advance(job: Job) -> Job | None:
            changed = job
            record = job.attempt(attempt)
            if record is not None and (record.checkpoint_step is None or step > record.checkpoint_step):
                changed = changed.with_attempt(record.model_copy(update={"checkpoint_step": step}), now=now)
            if job.checkpoint_step is None or step > job.checkpoint_step:
                changed = changed.model_copy(update={"checkpoint_step": step, "checkpoint_uri": uri, "updated_at": now})
            return None if changed is job else changed

        try:
            before, after = self._change(job_id, advance)
        except JobNotFoundError:
            return Reaction(f"ignored: no job {job_id}")
        if after is before:
            return Reaction(f"ignored: step {step} is not newer than {before.checkpoint_step}", after)
        settled = self.settle(job_id)
        return Reaction(f"checkpoint at step {step}", settled.job or after, {"CheckpointsCommitted": 1})

    def heartbeat(self, *, job_id: str, attempt: int, step: int) -> Reaction:
        now = self.now
        first: list[bool] = []

        def beat(job: Job) -> Job | None:
            record = job.attempt(attempt)
            if record is None or record.is_over:
                return None
            if record.heartbeat_step is not None and step < record.heartbeat_step:
                return None
            first[:] = [record.last_heartbeat_at is None]
            updated = record.model_copy(update={"last_heartbeat_at": now, "heartbeat_step": step})
            return job.with_attempt(updated, now=now)

        try:
            before, after = self._change(job_id, beat)
        except JobNotFoundError:
            return Reaction(f"ignored: no job {job_id}")
        if after is before:
            return Reaction("ignored: stale heartbeat", after)
        metrics = self._resume_metrics(after, attempt) if first and first[0] else {}
        return Reaction(f"heartbeat at step {step}", after, metrics)

    @staticmethod
    def _resume_metrics(job: Job, attempt_number: int) -> dict[str, float]:
        """On a replacement's first heartbeat: seconds from the warning and steps lost to it."""
        current = job.attempt(attempt_number)
        previous = next((a for a in reversed(job.attempts) if a.number < attempt_number and a.instance_ids), None)
        if current is None or previous is None or previous.interrupted_at is None or current.last_heartbeat_at is None:
            return {}
        metrics = {"SecondsWarningToResumed": (current.last_heartbeat_at - previous.interrupted_at).total_seconds()}
        if previous.heartbeat_step is not None and job.checkpoint_step is not None:
            # The replacement resumes from the newest committed checkpoint, whatever was known at launch.
            metrics["StepsLostToInterruption"] = float(max(0, previous.heartbeat_step - job.checkpoint_step))
        return metrics

    def job_exited(
        self, *, job_id: str, attempt: int, exit_code: int, instance_id: str | None = None, node_rank: int | None = None
    ) -> Reaction:
        """Record a node's exit code, then judge the attempt."""

        def record(job: Job) -> Job | None:
            found = job.attempt(attempt)
            if found is None or found.is_over:
                return None
            iid = instance_id
            if iid is None and node_rank is not None and 0 <= node_rank < len(found.instance_ids):
                iid = found.instance_ids[node_rank]
            if iid is None or iid not in found.instance_ids or iid in found.exit_codes:
                return None
            codes = {**found.exit_codes, iid: exit_code}
            return job.with_attempt(found.model_copy(update={"exit_codes": codes}), now=self.now)

        try:
            before, after = self._change(job_id, record)
        except JobNotFoundError:
            return Reaction(f"ignored: no job {job_id}")
        if after is before:
            return Reaction("ignored: exit already recorded, or the attempt is over", after)
        return self.settle(job_id)

    # ---- instances --------------------------------------------------------------------------
    def instance_state(self, instance_id: str, state: str) -> Reaction:
        """An instance stopped or went away: record it, then judge its attempt."""
        if state not in GONE_STATES:
            return Reaction(f"ignored: state {state} changes nothing")
        job = self._job_of_instance(instance_id)
        if job is None:
            return not_ours(instance_id)
        self.record_gone(job.job_id, [instance_id])
        return self.settle(job.job_id)  # even for a duplicate: a verdict may have become due since

    def record_gone(self, job_id: str, instance_ids: Sequence[str]) -> bool:
        now = self.now

        def record(job: Job) -> Job | None:
            changed = job
            for iid in instance_ids:
                attempt = changed.attempt_of_instance(iid)
                if attempt is None or attempt.is_over or iid in attempt.gone:
                    continue
                gone = (*attempt.gone, iid)
                updated = attempt.model_copy(update={"gone": gone})
                if updated.all_gone:
                    updated = updated.model_copy(update={"gone_at": now})
                changed = changed.with_attempt(updated, now=now)
            return None if changed is job else changed

        before, after = self._change(job_id, record)
        return after is not before

    # ---- deciding -------------------------------------------------------------------------
    def settle(self, job_id: str) -> Reaction:
        """Judge every unfinished attempt from its record and move the job accordingly."""
        effects: list[Effect] = []
        outcome: list[str] = []

        def decide(job: Job) -> Job | None:
            effects.clear()
            outcome.clear()
            now = self.now
            changed = job
            for attempt in job.attempts:
                if attempt.is_over or not attempt.instance_ids:
                    continue
                judgement = judge_attempt(changed, attempt, now=now)
                if judgement.verdict is Verdict.WAIT:
                    continue
                if judgement.verdict is Verdict.TERMINATE_GANG:
                    live = [i for i in attempt.instance_ids if i not in attempt.gone]
                    effects.append(partial(self.jobs.compute.terminate, live))
                    outcome.append(f"gang of attempt {attempt.number} terminated after a crash ({judgement.detail})")
                    continue
                was_current = changed.is_current(attempt)
                update: dict[str, object] = {"ended_at": now, "end_reason": judgement.verdict.value}
                if judgement.verdict is Verdict.INTERRUPTED and attempt.interrupted_at is None:
                    update["interrupted_at"] = now  # reclaimed without a warning: the replacement avoids its pool
                ended = attempt.model_copy(update=update)
                changed = changed.with_attempt(ended, now=now)
                ids = list(attempt.instance_ids)
                effects.append(partial(self.jobs.alarms.delete, instance_ids=ids))
                outcome.append(f"attempt {attempt.number} {judgement.verdict.value}")
                if not was_current:
                    continue
                move = moves_for(changed, judgement)
                if move is None:
                    continue
                counters = {
                    "interruptions": changed.interruptions + (1 if move.counts_interruption else 0),
                    "crashes": changed.crashes + (1 if move.counts_crash else 0),
                }
                for target, reason in move.steps:
                    changed = changed.transition(target, reason, now=now, detail=judgement.detail, **counters)
                if move.relaunch:
                    outcome.append("relaunch")
            changed = self._maybe_execute_stop(changed, now, effects, outcome)
            return None if changed is job else changed

        try:
            before, after = self._change(job_id, decide)
        except JobNotFoundError:
            return Reaction(f"ignored: no job {job_id}")
        for effect in effects:
            try:
                effect()
            except Exception:
                log.warning("effect after settling %s failed", job_id, exc_info=True)
        if after is before and not outcome:
            return Reaction("nothing to decide yet", after)
        if "relaunch" in outcome or after.state in (JobState.QUEUED, JobState.INTERRUPTED):
            after = self.jobs.launch(job_id)
        return Reaction("; ".join(outcome) or "settled", after, _settle_metrics(before, after))

    def _maybe_execute_stop(self, job: Job, now: datetime, effects: list[Effect], outcome: list[str]) -> Job:
        request = job.stop_request
        attempt = job.current_attempt
        if request is None or request.executed_at is not None or attempt is None or attempt.is_over:
            return job
        if not stop_is_due(job, now=now):
            return job
        live = [i for i in attempt.instance_ids if i not in attempt.gone]
        if attempt.market is Market.ON_DEMAND:
            effects.append(partial(self.jobs.compute.stop, live))
            outcome.append(f"stopping {len(live)} on-demand instance(s) for {request.reason.value}")
        else:
            effects.append(partial(self.jobs.compute.terminate, live))
            outcome.append(f"terminating {len(live)} spot instance(s) for {request.reason.value}")
        executed = request.model_copy(update={"executed_at": now})
        return job.model_copy(update={"stop_request": executed, "updated_at": now})

    # ---- policy stops -----------------------------------------------------------------------
    def request_stop(self, job_id: str, reason: Reason, *, detail: str) -> Reaction:
        """Checkpoint first; the instances go when that checkpoint is committed (or at the deadline)."""
        now = self.now

        def ask(job: Job) -> Job | None:
            if job.state is not JobState.RUNNING or job.stop_request is not None:
                return None
            request = StopRequest(
                reason=reason,
                requested_at=now,
                deadline=now + STOP_CHECKPOINT_DEADLINE,
                checkpoint_step_at_request=job.checkpoint_step,
                detail=detail,
            )
            return job.model_copy(update={"stop_request": request, "updated_at": now, "status_detail": detail})

        try:
            before, after = self._change(job_id, ask)
        except JobNotFoundError:
            return Reaction(f"ignored: no job {job_id}")
        if after is before:
            return Reaction("ignored: not running, or a stop is already under way", after)
        attempt = after.current_attempt
        if attempt is not None:
            self._signal(attempt, job_id)
        metric = {Reason.IDLE: "IdleStops", Reason.BUDGET_EXCEEDED: "BudgetStops"}.get(reason, "PolicyStops")
        return Reaction(f"stop requested ({reason.value}): checkpoint first", after, {metric: 1})

    def idle_alarm(self, instance_id: str) -> Reaction:
        job = self._job_of_instance(instance_id)
        if job is None:
            return not_ours(instance_id)
        if running_attempt(job, instance_id) is None:
            self.jobs.alarms.delete(instance_ids=[instance_id])
            return Reaction("ignored: the alarm's attempt is over (alarm deleted)", job)
        idle = job.require_spec().idle
        detail = f"GPU utilization below {idle.gpu_util_below_percent:g}% for {idle.for_minutes} min on {instance_id}"
        if idle.action is IdleAction.IGNORE:
            self._change(
                job.job_id,
                lambda j: j.model_copy(
                    update={"status_detail": f"{detail} (idle action: ignore)", "updated_at": self.now}
                ),
            )
            return Reaction("recorded: idle action is ignore", job, {"IdleIgnored": 1})
        return self.request_stop(job.job_id, Reason.IDLE, detail=detail)


def not_ours(instance_id: str) -> Reaction:
    """EC2 and CloudWatch events cover the whole account: most instances are somebody else's."""
    return Reaction(f"ignored: {instance_id} is not a gpujobs instance")


def running_attempt(job: Job, instance_id: str) -> Attempt | None:
    """The attempt of `instance_id` if it is the job's current, unfinished attempt of a RUNNING job:
    the only attempt a warning, a rebalance or an idle alarm can still act on."""
    attempt = job.attempt_of_instance(instance_id)
    if attempt is None or attempt.is_over or not job.is_current(attempt) or job.state is not JobState.RUNNING:
        return None
    return attempt


def _settle_metrics(before: Job, after: Job) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if after.interruptions > before.interruptions:
        metrics["SpotInterruptions"] = float(after.interruptions - before.interruptions)
    if after.crashes > before.crashes:
        metrics["AttemptsCrashed"] = float(after.crashes - before.crashes)
    if after.state is not before.state and after.state.is_terminal:
        metrics[f"Jobs{after.state.value.title()}"] = 1.0
    return metrics
