"""The reconciler: level-triggered repair of whatever events were lost, once a minute.

Events are hints; this reads what is actually there (the active jobs by state, through the
`ByState` index, and the stack's live instances, through one tag-filtered query) and makes the
record agree with it. Its cost grows with the number of active jobs and live instances, never with
the table's history, and every repair goes through the same use cases the event handlers use, so a
repair that races an event changes nothing twice.

It is also where level-triggered effects converge: each tick settles every RUNNING job, which
issues a due policy stop again while its instances live; records instances EC2 shows stopping or
stopped (a lost `stopped` event); recreates the idle alarms a RUNNING GPU job lacks and deletes
those of attempts that are over. The stopped instances of a job that ended STOPPED are kept on
purpose (an on-demand policy stop stops rather than terminates, so the disk stays for inspection
and costs only its EBS volume); the orphan sweep leaves them alone, and a cancel message for the
STOPPED job terminates them.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from gpujobs.contract import GONE_STATES, STOPPED_STATES, UP_STATES
from gpujobs.domain.budget import BudgetMode, BudgetPolicy, period_rolled_over
from gpujobs.domain.cost import BilledPool, billed_pools, cost_of, runtime_of
from gpujobs.domain.effects import CreateAlarms, DeleteAlarms, Outcome, live_instances
from gpujobs.domain.job import Job
from gpujobs.domain.launching import wants_idle_alarms
from gpujobs.domain.states import ACTIVE_STATES, JobState, Reason
from gpujobs.service.ports import JobNotFoundError, Prices, TaggedInstance
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
        alarmed = self._alarmed_instances()
        watched: set[str] = set()

        for job in active.values():
            try:
                watched |= self._repair(job, by_job.get(job.job_id, []), now, alarmed, report)
            except Exception:
                log.exception("reconciling %s failed", job.job_id)
                report.count("errors")
        self._terminate_orphans(instances, active, now, report)
        if alarmed is not None:
            self._delete_leaked_alarms(alarmed - watched, report)
        return report

    def _alarmed_instances(self) -> set[str] | None:
        """The instances with an idle alarm; None when they cannot be listed now (the alarm repairs
        wait for the next tick, every other repair goes ahead)."""
        try:
            return set(self.reactions.jobs.alarms.instance_ids())
        except Exception:
            log.exception("could not list the idle alarms")
            return None

    # ---- per job ----------------------------------------------------------------------------------
    def _repair(
        self, job: Job, live: list[TaggedInstance], now: datetime, alarmed: set[str] | None, report: ReconcileReport
    ) -> set[str]:
        """Repair one active job; returns the instances whose idle alarms it wants kept."""
        reactions, jobs = self.reactions, self.reactions.jobs
        if job.state is JobState.QUEUED:
            if job.next_try_at is None or job.next_try_at <= now:
                launched = jobs.launch(job.job_id)
                if launched.state is not JobState.QUEUED or launched.version != job.version:
                    report.count("queued jobs retried")
            return set()
        if job.state is JobState.LAUNCHING:
            attempt = job.current_attempt
            if attempt and attempt.lease_expires_at and attempt.lease_expires_at <= now:
                jobs.launch(job.job_id)
                report.count("stuck launches taken over")
            return set()
        if job.state is JobState.INTERRUPTED:
            jobs.launch(job.job_id)
            report.count("replacements launched")
            return set()
        # RUNNING: instances that are gone (or stopped) without a recorded event
        still_up = {i.instance_id for i in live if i.state not in GONE_STATES}
        for attempt in job.attempts:
            if attempt.is_over or not attempt.instance_ids:
                continue
            missing = tuple(i for i in attempt.instance_ids if i not in still_up and i not in attempt.gone)
            if missing and reactions.record_gone(job.job_id, missing).outcome is Outcome.GONE_RECORDED:
                report.count("lost state changes repaired")
        current = jobs.store.get(job.job_id)
        self._enforce_caps(current, now, report)
        self._check_heartbeat(current, now, report)
        settled = reactions.settle(job.job_id)
        if settled.outcome is not Outcome.NOTHING_TO_DECIDE:
            report.count("attempts settled")
        return self._ensure_alarms(settled.job or current, alarmed, report)

    def _ensure_alarms(self, job: Job, alarmed: set[str] | None, report: ReconcileReport) -> set[str]:
        """A RUNNING GPU job's live instances each have an idle alarm (its creation may have failed)."""
        attempt = job.current_attempt
        if alarmed is None or job.state is not JobState.RUNNING or not wants_idle_alarms(job):
            return set()
        if attempt is None or attempt.is_over:
            return set()
        live = live_instances(attempt)
        lacking = tuple(i for i in live if i not in alarmed)
        if lacking:
            idle = job.require_spec().idle
            self.reactions.jobs.carry_out(
                [CreateAlarms(job.job_id, lacking, idle.gpu_util_below_percent, idle.for_minutes)]
            )
            report.repairs["idle alarms recreated"] += len(lacking)
        return set(live)

    def _delete_leaked_alarms(self, unwatched: set[str], report: ReconcileReport) -> None:
        """Alarms no RUNNING job watched this tick: deleted once the record says their attempt is over.

        Each is re-read, so an alarm a launch has just created is never taken for a leak; one whose
        instance the (eventually consistent) index does not know yet is left for a later tick."""
        store = self.reactions.jobs.store
        leaked = []
        for iid in sorted(unwatched):
            job = store.find_by_instance(iid)
            attempt = job.attempt_of_instance(iid) if job else None
            if job is not None and (attempt is None or attempt.is_over or job.state.is_terminal):
                leaked.append(iid)
        if leaked:
            self.reactions.jobs.carry_out([DeleteAlarms(tuple(leaked))])
            report.repairs["idle alarms deleted"] += len(leaked)

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
            cost = cost_of(job, now, self._hourly_prices(job))
            if cost >= spec.max_cost_usd:
                self.reactions.request_stop(
                    job.job_id,
                    Reason.MAX_COST,
                    detail=f"spent about ${cost:.2f} of max_cost_usd ${spec.max_cost_usd:.2f}",
                )
                report.count("cost caps")

    def _hourly_prices(self, job: Job) -> dict[BilledPool, float | None]:
        return {
            pool: self.prices.hourly_usd(instance_type=pool.instance_type, market=pool.market, zone=pool.zone)
            for pool in billed_pools(job)
        }

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
            if job is None and self._kept_after_a_stop(inst):
                continue
            if attempt is None or (attempt.is_over and inst.state in UP_STATES):
                orphans.append(inst.instance_id)
        if orphans:
            log.warning("terminating %d orphan instance(s): %s", len(orphans), orphans)
            self.reactions.jobs.compute.terminate(orphans)
            report.repairs["orphans terminated"] += len(orphans)

    def _kept_after_a_stop(self, inst: TaggedInstance) -> bool:
        """A stopped instance of the last attempt of a job that ended STOPPED is kept on purpose."""
        if inst.state not in STOPPED_STATES:
            return False
        try:
            job = self.reactions.jobs.store.get(inst.job_id)
        except JobNotFoundError:
            return False
        current = job.current_attempt
        return job.state is JobState.STOPPED and current is not None and current.number == inst.attempt

    def _release_budget_holds(self, today: date, report: ReconcileReport) -> None:
        budgets = self.reactions.jobs.budgets
        for policy in budgets.held_scopes():
            try:
                rolled = period_rolled_over(policy.period, today)
            except ValueError:
                log.exception("budget policy of scope %s has a malformed period", policy.scope)
                report.count("errors")
                rolled = False
            if rolled or self.budget_has_room(policy):
                budgets.set_policy(BudgetPolicy(scope=policy.scope, mode=BudgetMode.NORMAL, period=policy.period))
                report.count("budget holds released")
