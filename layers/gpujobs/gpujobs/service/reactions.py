"""Reacting to the cloud: spot warnings, instance fate, trainer reports, idle GPUs, policy stops.

Every reaction has the same shape as the core's use cases: find the job (by instance id through
the store's index when the event carries no tags), take the pure decision of `domain.decisions` on
the stored record, write it conditionally (`JobService.change`, which retries lost races on a
fresh record and publishes every transition), then carry out its effects (signal, stop,
terminate, alarms, launch). Observations are recorded before anything is decided, and `settle()`
decides from the whole record, so an event that arrives twice, late or out of order changes
nothing the second time, and the reconciler can call `settle()` at any moment with the same result.

Rules filter what reaches each function, but a rule is configuration and anyone who can put events
on a bus can shape them: so every reaction checks again what it acts on. A malformed job or
instance id is ignored before any lookup (`MALFORMED`), an instance the store does not know is
somebody else's (`NOT_OURS`), and an idle alarm counts only under the exact name this stack gives
it (`OTHER_STACK`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpujobs.contract import GONE_STATES, idle_alarm_name
from gpujobs.domain import decisions
from gpujobs.domain.effects import Decision, Outcome
from gpujobs.domain.job import Job
from gpujobs.domain.job_ids import JOB_ID
from gpujobs.domain.reports import INSTANCE_ID, Report
from gpujobs.domain.states import Reason
from gpujobs.service.jobs import JobService
from gpujobs.service.ports import JobNotFoundError, Ports

log = logging.getLogger(__name__)

Decide = Callable[[Job, datetime], Decision]


@dataclass(frozen=True)
class Reaction:
    """What a handler logs and counts: what happened, the job concerned (if any), and why."""

    outcome: Outcome
    job: Job | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    detail: str = ""

    @property
    def ignored(self) -> bool:
        return self.outcome.ignored


@dataclass
class Reactions:
    ports: Ports
    jobs: JobService
    """For its use cases: the one write path (`change`, `act`) and the launch a decision may call for."""

    def _react(self, job_id: str, decide: Decide, *, current: Job | None = None) -> Reaction:
        """Decide on the stored job (`current`: as read consistently moments ago), write, publish,
        then act: the one path every reaction takes."""
        if not JOB_ID.fullmatch(job_id):
            return malformed(f"job id {job_id!r}")
        clock = self.ports.clock
        try:
            applied = self.jobs.change(job_id, lambda job: decide(job, clock.now()), first=current)
        except JobNotFoundError:
            return Reaction(Outcome.UNKNOWN_JOB, detail=f"no job {job_id}")
        after = self.jobs.act(applied)
        decision = applied.decision
        return Reaction(decision.outcome, after, dict(decision.metrics), decision.detail)

    def _react_to_instance(self, instance_id: str, decide: Decide) -> Reaction:
        if not INSTANCE_ID.fullmatch(instance_id):
            return malformed(f"instance id {instance_id!r}")
        job = self.ports.store.find_by_instance(instance_id)
        return not_ours(instance_id) if job is None else self._react(job.job_id, decide)

    # ---- spot -----------------------------------------------------------------------------
    def spot_warning(self, instance_id: str, *, action: str = "terminate") -> Reaction:
        """Checkpoint now, and launch the replacement at once in another pool."""
        return self._react_to_instance(
            instance_id, lambda job, now: decisions.on_spot_warning(job, instance_id, now=now, action=action)
        )

    def keep_market(self, job_id: str, *, current: Job | None = None) -> Reaction:
        """Move a running job to the market it needs, if it needs another: a deadline's (`deadline`),
        or a `spot-first` job's way back to spot once spot is calm (`volatility`)."""
        from gpujobs.domain import deadline, ladder, volatility  # the reconciler's only: no event handler loads them
        from gpujobs.domain.budget import BudgetMode

        def decide(job: Job, now: datetime) -> Decision:
            mode = self.ports.budgets.policy_for(job.team).mode
            allowed = ladder.movable_markets(job, spot_only=mode is BudgetMode.SPOT_ONLY, hold=mode is BudgetMode.HOLD)
            if job.require_spec().deadline is not None:
                return deadline.move_market(job, now=now, allowed=allowed)
            return volatility.back_to_spot(job, now=now, allowed=allowed)

        return self._react(job_id, decide, current=current)

    def rebalance(self, instance_id: str) -> Reaction:
        """A proactive checkpoint; no relaunch unless a warning follows."""
        return self._react_to_instance(instance_id, lambda job, now: decisions.on_rebalance(job, instance_id, now=now))

    # ---- reports from the training container ------------------------------------------------
    def report(self, report: Report) -> Reaction:
        """A proven report (`service.reports`): a checkpoint moves the newest checkpoint forward only
        (and may complete a pending policy stop), a heartbeat records progress, an exit records the
        node's exit code (and the message of a failed one), then the attempt is judged."""
        return self._react(report.job_id, lambda job, now: decisions.on_report(job, report, now=now))

    # ---- instances --------------------------------------------------------------------------
    def instance_state(self, instance_id: str, state: str) -> Reaction:
        """An instance stopped or went away: record it, then judge its attempt (even for a
        duplicate: a verdict may have become due since)."""
        if state not in GONE_STATES:
            return Reaction(Outcome.NOT_AN_END, detail=f"state {state} changes nothing")
        reasons = self._unheard_state_reason(instance_id)
        return self._react_to_instance(
            instance_id, lambda job, now: decisions.on_instance_gone(job, (instance_id,), now=now, reasons=reasons)
        )

    def _unheard_state_reason(self, instance_id: str) -> dict[str, str]:
        """EC2's state reason for an instance of an attempt that never reported (it may have died at
        boot: the reason is what `gpujobs status` shows of why); nothing for any other, so a job's
        normal end costs no extra call. Best effort: a refused DescribeInstances gives no reason."""
        job = self.ports.store.find_by_instance(instance_id) if INSTANCE_ID.fullmatch(instance_id) else None
        attempt = job.attempt_of_instance(instance_id) if job is not None else None
        if attempt is None or attempt.is_over or attempt.exit_codes or attempt.last_heartbeat_at is not None:
            return {}
        try:
            reason = self.ports.compute.state_reason(instance_id)
        except Exception:
            log.warning("could not read the state reason of %s", instance_id, exc_info=True)
            return {}
        return {instance_id: reason} if reason else {}

    def record_gone(self, job_id: str, instance_ids: tuple[str, ...], *, current: Job | None = None) -> Reaction:
        """Instances the reconciler found gone without an event; judged by the next `settle()`."""
        return self._react(job_id, lambda job, now: decisions.on_gone(job, instance_ids, now=now), current=current)

    def regroup(self, job_id: str, *, current: Job | None = None) -> Reaction:
        """A regrouping gang's tags and replacement launch, issued again (`domain.regroup.repair`)."""
        from gpujobs.domain import regroup  # the reconciler's only

        return self._react(job_id, lambda job, now: regroup.repair(job, now=now), current=current)

    def settle(self, job_id: str, *, current: Job | None = None) -> Reaction:
        """Judge every unfinished attempt from its record and move the job accordingly."""
        return self._react(job_id, lambda job, now: decisions.settle(job, now=now), current=current)

    # ---- policy stops -----------------------------------------------------------------------
    def request_stop(self, job_id: str, reason: Reason, *, detail: str, current: Job | None = None) -> Reaction:
        """Checkpoint first; the instances go when that checkpoint is committed (or at the deadline)."""
        return self._react(
            job_id, lambda job, now: decisions.request_stop(job, reason, detail=detail, now=now), current=current
        )

    def idle_alarm(self, instance_id: str) -> Reaction:
        return self._react_to_instance(instance_id, lambda job, now: decisions.on_idle_alarm(job, instance_id, now=now))

    def stack_alarm(self, *, alarm_name: str, instance_id: str, stack_name: str) -> Reaction:
        """An idle alarm as the cloud reports it: acted on only under the exact name this stack gives
        the alarm of the instance it names; another stack's (or a crafted) alarm is ignored."""
        if alarm_name != idle_alarm_name(stack_name, instance_id):
            return Reaction(Outcome.OTHER_STACK, detail=f"alarm {alarm_name[:120]!r} is not {stack_name}'s")
        return self.idle_alarm(instance_id)


def malformed(what: str) -> Reaction:
    return Reaction(Outcome.MALFORMED, detail=f"{what[:80]} is malformed")


def not_ours(instance_id: str) -> Reaction:
    """EC2 and CloudWatch events cover the whole account: most instances are somebody else's."""
    return Reaction(Outcome.NOT_OURS, detail=f"{instance_id} is not a gpujobs instance")
