"""The reconciler: level-triggered repair of whatever events were lost, once a minute.

Events are hints; this reads what is actually there (the active jobs by state, through the
`ByState` index, and the stack's live instances, through one tag-filtered query) and makes the
record agree with it. Its cost grows with the number of active jobs and live instances, never with
the table's history, and every repair goes through the same use cases the event handlers use, so a
repair that races an event changes nothing twice.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from gpujobs.domain.gangs import overdue_survivors
from gpujobs.domain.job import Job, Market
from gpujobs.domain.states import ACTIVE_STATES, JobState, Reason
from gpujobs.service.ports import BudgetMode, BudgetPolicy, JobNotFoundError, Prices, TaggedInstance
from gpujobs.service.reactions import Reactions

log = logging.getLogger(__name__)

ORPHAN_GRACE = timedelta(minutes=10)
"""An instance younger than this may belong to a launch whose record is being written."""
HEARTBEAT_OVERDUE = timedelta(minutes=15)
MAX_ACTIVE_JOBS = 5000


@dataclass
class ReconcileReport:
    active_jobs: int = 0
    live_instances: int = 0
    repairs: Counter[str] = field(default_factory=Counter)

    def count(self, what: str) -> None:
        self.repairs[what] += 1


BudgetCheck = Callable[[BudgetPolicy], bool]
"""True when a held scope's budget has room again (the limit was raised); None-safe callers."""


@dataclass
class Reconciler:
    reactions: Reactions
    prices: Prices
    budget_has_room: BudgetCheck = field(default=lambda _policy: False)

    def run(self) -> ReconcileReport:
        jobs = self.reactions.jobs
        now = jobs.clock.now()
        report = ReconcileReport()
        self._release_budget_holds(now.date(), report)
        active: dict[str, Job] = {}
        for state in ACTIVE_STATES:
            for job in jobs.store.list_by_state(state, limit=MAX_ACTIVE_JOBS):
                active[job.job_id] = job
        instances = jobs.compute.list_instances()
        by_job: dict[str, list[TaggedInstance]] = defaultdict(list)
        for inst in instances:
            by_job[inst.job_id].append(inst)
        report.active_jobs, report.live_instances = len(active), len(instances)
        try:
            self._sweep_placement_groups(active, report)  # first: a launch below may need a free group
        except Exception:
            log.exception("sweeping placement groups failed")
            report.count("errors")

        for job in active.values():
            try:
                self._repair(job, by_job.get(job.job_id, []), now, report)
            except Exception:
                log.exception("reconciling %s failed", job.job_id)
                report.count("errors")
        self._terminate_orphans(instances, active, now, report)
        return report

    # ---- per job ----------------------------------------------------------------------------------
    def _repair(self, job: Job, live: list[TaggedInstance], now: datetime, report: ReconcileReport) -> None:
        reactions, jobs = self.reactions, self.reactions.jobs
        self._terminate_reclaimed_survivors(job, now, report)
        if job.state is JobState.QUEUED:
            if job.next_try_at is None or job.next_try_at <= now:
                launched = jobs.launch(job.job_id)
                if launched.state is not JobState.QUEUED or launched.version != job.version:
                    report.count("queued jobs retried")
            return
        if job.state is JobState.LAUNCHING:
            attempt = job.current_attempt
            if attempt and attempt.lease_expires_at and attempt.lease_expires_at <= now:
                jobs.launch(job.job_id)
                report.count("stuck launches taken over")
            return
        if job.state is JobState.INTERRUPTED:
            jobs.launch(job.job_id)
            report.count("replacements launched")
            return
        # RUNNING: instances that are gone without a recorded event
        live_ids = {i.instance_id for i in live}
        for attempt in job.attempts:
            if attempt.is_over or not attempt.instance_ids:
                continue
            missing = [i for i in attempt.instance_ids if i not in live_ids and i not in attempt.gone]
            if missing and reactions.record_gone(job.job_id, missing):
                report.count("lost state changes repaired")
        current = jobs.store.get(job.job_id)
        self._enforce_caps(current, now, report)
        self._check_heartbeat(current, now, report)
        settled = reactions.settle(job.job_id)
        if not settled.outcome.startswith("nothing"):
            report.count("attempts settled")

    def _terminate_reclaimed_survivors(self, job: Job, now: datetime, report: ReconcileReport) -> None:
        """The rest of a reclaimed gang whose trainers hang past the warning window and a grace:
        terminated (again on every tick until they are seen gone), so one attempt never outlives
        its replacement's start by more than a few minutes."""
        for attempt in job.attempts:
            survivors = overdue_survivors(attempt, now=now)
            if survivors:
                log.warning("%s: attempt %d was reclaimed; terminating %s", job.job_id, attempt.number, survivors)
                self.reactions.jobs.compute.terminate(list(survivors))
                report.repairs["reclaimed survivors terminated"] += len(survivors)

    def _check_heartbeat(self, job: Job, now: datetime, report: ReconcileReport) -> None:
        """A trainer that reported heartbeats and then went silent is hung: replace its gang."""
        attempt = job.current_attempt
        if job.state is not JobState.RUNNING or attempt is None or attempt.is_over:
            return
        if attempt.last_heartbeat_at is None or now - attempt.last_heartbeat_at < HEARTBEAT_OVERDUE:
            return
        live = [i for i in attempt.instance_ids if i not in attempt.gone]
        if live:
            log.warning("%s: no heartbeat since %s; terminating %s", job.job_id, attempt.last_heartbeat_at, live)
            self.reactions.jobs.compute.terminate(live)
            report.count("hung attempts terminated")

    def _enforce_caps(self, job: Job, now: datetime, report: ReconcileReport) -> None:
        if job.state is not JobState.RUNNING or job.stop_request is not None:
            return
        spec = job.require_spec()
        runtime = runtime_of(job, now)
        if runtime >= timedelta(minutes=spec.max_runtime_minutes):
            self.reactions.request_stop(
                job.job_id,
                Reason.MAX_RUNTIME,
                detail=f"ran {runtime} of max_runtime_minutes {spec.max_runtime_minutes}",
            )
            report.count("runtime caps")
            return
        if spec.max_cost_usd is not None:
            cost = cost_of(job, now, self.prices)
            if cost >= spec.max_cost_usd:
                self.reactions.request_stop(
                    job.job_id,
                    Reason.MAX_COST,
                    detail=f"spent about ${cost:.2f} of max_cost_usd ${spec.max_cost_usd:.2f}",
                )
                report.count("cost caps")

    # ---- stack-wide -------------------------------------------------------------------------------
    def _terminate_orphans(
        self, instances: list[TaggedInstance], active: dict[str, Job], now: datetime, report: ReconcileReport
    ) -> None:
        orphans = []
        for inst in instances:
            if now - inst.launched_at < ORPHAN_GRACE:
                continue
            job = active.get(inst.job_id)
            attempt = job.attempt(inst.attempt) if job else None
            if attempt is None or (attempt.is_over and inst.state in ("pending", "running")):
                orphans.append(inst.instance_id)
        if orphans:
            log.warning("terminating %d orphan instance(s): %s", len(orphans), orphans)
            self.reactions.jobs.compute.terminate(orphans)
            report.repairs["orphans terminated"] += len(orphans)

    def _sweep_placement_groups(self, active: dict[str, Job], report: ReconcileReport) -> None:
        """Delete the groups of ended attempts and jobs: a Region holds only 500 placement groups.

        A group whose attempt looks unfinished in the active view is kept; any other is re-read
        consistently first (the view is eventually consistent, and a launch creates its group right
        after its claim is saved). A group still holding instances is retried on the next tick.
        """
        store = self.reactions.jobs.store
        for group in self.reactions.jobs.compute.list_placement_groups():
            seen = active.get(group.job_id)
            if _attempt_unfinished(seen, group.attempt):
                continue
            try:
                current: Job | None = store.get(group.job_id)
            except JobNotFoundError:
                current = None
            if _attempt_unfinished(current, group.attempt):
                continue
            if self.reactions.jobs.compute.delete_placement_group(group.name):
                report.count("placement groups deleted")

    def _release_budget_holds(self, today: date, report: ReconcileReport) -> None:
        budgets = self.reactions.jobs.budgets
        for policy in budgets.held_scopes():
            rolled = bool(policy.period) and policy.period != today.strftime("%Y-%m")
            if rolled or self.budget_has_room(policy):
                budgets.set_policy(BudgetPolicy(scope=policy.scope, mode=BudgetMode.NORMAL, period=policy.period))
                report.count("budget holds released")


def _attempt_unfinished(job: Job | None, number: int) -> bool:
    attempt = job.attempt(number) if job is not None else None
    return job is not None and not job.state.is_terminal and attempt is not None and not attempt.is_over


def runtime_of(job: Job, now: datetime) -> timedelta:
    """Time the job has held instances, over all its attempts (retired ones included)."""
    total = job.retired.runtime
    for attempt in job.attempts:
        if attempt.instance_ids:
            total += (attempt.ended_at or now) - attempt.started_at
    return total


def cost_of(job: Job, now: datetime, prices: Prices) -> float:
    """Instance-hours times price per attempt; an unknown price counts as on-demand's, or zero."""
    total = sum(
        usage.instance_seconds
        / 3600
        * (prices.hourly_usd(instance_type=usage.instance_type, market=usage.market, zone=usage.zone) or 0.0)
        for usage in job.retired.usage
    )
    for attempt in job.attempts:
        if not attempt.instance_ids or attempt.instance_type is None:
            continue
        hours = ((attempt.ended_at or now) - attempt.started_at).total_seconds() / 3600
        price = prices.hourly_usd(
            instance_type=attempt.instance_type, market=attempt.market or Market.ON_DEMAND, zone=attempt.zone
        )
        total += hours * len(attempt.instance_ids) * (price or 0.0)
    return total
