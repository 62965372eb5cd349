"""The reconciler: level-triggered repair of whatever events were lost, once a minute.

Events are hints; this reads what is actually there (the active jobs by state, through the
`ByState` index, and the stack's live instances, through one tag-filtered query) and makes the
record agree with it. Its cost grows with the number of active jobs and live instances, never with
the table's history, and every repair goes through the same use cases the event handlers use, so a
repair that races an event changes nothing twice.

A run works in order of what a lost minute costs most:
1. Budget policies: lapsed ones are lifted (a hold early when its budget has room again; spot-only
   only when the period rolls over), and the holds in force are read once for the run.
2. Jobs that hold instances (RUNNING): lost state changes, budget holds (level-triggered: a job
   that was still launching when the alert came is asked to stop once it runs), runtime and cost
   caps, a deadline's move to the market it needs (`domain.deadline`), overdue or missing first
   heartbeats (not counting silence while the Reports function was throttled: one metric read per
   tick), then the attempt is settled. A job between attempts that still holds an unfinished
   one (interrupted just before a hold sent it back to the queue) has it settled too.
   Least recently updated first (a hung job, silent for longest, is never the one left out), read
   consistently 100 at a time (one BatchGetItem, just before their repairs; each repair decides on
   what the one before it wrote), and only while `REPAIR_RESERVE` of the run is left: at 10,000
   running jobs the tick still ends in time, the rest wait for the next run (counted).
3. Orphan instances. The `ByState` index is eventually consistent and a job can move between the
   state queries, so an instance that looks orphaned is terminated only if a consistent read of
   its job agrees: a live gang is never killed from a stale view. Then the security groups of jobs
   that are over and hold no instance any more (also leftovers whose job is unknown).
4. The admission round (`service.admitting`): jobs waiting for their team's GPU quota are admitted
   in fair-share order, and borrowed GPUs wanted back are preempted after a checkpoint.
   Then launch work, which may walk a capacity ladder: replacements of interrupted jobs, launches stuck
   past their lease, then queued jobs whose next try is due (admitted), longest-waiting first. It stops while
   `LAUNCH_WORK_RESERVE` of the run's deadline is left; what is left over waits for the next run,
   so a crowd of queued jobs in a capacity crunch never starves the repairs above.
5. The objects of jobs that ended `object_retention` ago (`domain.retention`), with the time left.

An item this release cannot read (a newer release's record, after a rollback) never stops a run:
the listing skips it, logs its key and counts it (`UNREADABLE_RECORDS_SKIPPED`); its instances,
placement groups and security group are left alone, since nothing here can tell whether they are
still its job's. The rest of the run goes on.

It is also where level-triggered effects converge: each tick settles every RUNNING job (a due
policy stop is issued again while its instances live); records instances EC2 shows stopping or
stopped; recreates the idle alarms a RUNNING GPU job lacks and deletes those of attempts that are
over; notes, once per attempt, a job whose idle alarms get no GPU metric. The stopped instances of
a job that ended STOPPED are kept on purpose (an on-demand policy stop stops rather than
terminates, so the disk stays for inspection); the orphan sweep leaves them alone, and a cancel
message for the STOPPED job terminates them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from gpujobs.contract import GONE_STATES, IDLE_DETECTION_OFF
from gpujobs.domain import decisions, retention
from gpujobs.domain.budget import BudgetMode, BudgetPolicy, hold_over, lifts_early, period_rolled_over
from gpujobs.domain.cost import BilledPool, billed_pools, cost_of, price_erring_high, runtime_of
from gpujobs.domain.effects import CreateAlarms, DeleteAlarms, Outcome, Terminate, live_instances
from gpujobs.domain.gangs import overdue_survivors
from gpujobs.domain.hangs import on_hang
from gpujobs.domain.idle_detection import note_idle_detection_off
from gpujobs.domain.job import Job
from gpujobs.domain.launching import wants_idle_alarms
from gpujobs.domain.states import ACTIVE_STATES, MAX_ACTIVE_JOBS, JobState, Reason
from gpujobs.service.jobs import JobService
from gpujobs.service.launch_work import LaunchWork
from gpujobs.service.ports import IdleAlarmState, Ports, TaggedInstance, UnreadableJobError
from gpujobs.service.reactions import Reactions
from gpujobs.service.repairs import ReconcileReport, Repair
from gpujobs.service.sweeps import StackSweeps

log = logging.getLogger(__name__)

LAUNCH_WORK_RESERVE = timedelta(seconds=30)
"""Launch work starts only while this much of the run is left: one ladder walk fits in it."""
REPAIR_RESERVE = LAUNCH_WORK_RESERVE + timedelta(seconds=15)
"""Running jobs are repaired only while this much of the run is left: the orphan sweep and the
launch work after them get their share of every tick, however many jobs run."""
READ_BATCH = 100
"""Running jobs are read consistently this many at a time (one BatchGetItem), just before their repairs."""


@dataclass
class Reconciler:
    ports: Ports
    jobs: JobService
    """For its use cases: the one write path, the actuator's effects and launches."""
    reactions: Reactions
    """For the reactions it repeats from the record: gone instances, settling, stops, deadline moves."""
    object_retention: timedelta = retention.OBJECT_RETENTION
    """How long an ended job's objects are kept (the template's `CheckpointRetentionDays`)."""

    def run(self, *, deadline: datetime | None = None) -> ReconcileReport:
        """One pass; launch work stops `LAUNCH_WORK_RESERVE` before `deadline` (the Lambda's own)."""
        ports = self.ports
        now = ports.clock.now()

        def near(reserve: timedelta) -> bool:
            return deadline is not None and ports.clock.now() >= deadline - reserve

        report = ReconcileReport()
        holds = self._budget_holds(now.date(), report)
        active, unreadable = self._active_jobs(report)
        instances = ports.compute.list_instances()
        by_job: dict[str, list[TaggedInstance]] = defaultdict(list)
        for inst in instances:
            by_job[inst.job_id].append(inst)
        report.active_jobs, report.live_instances = len(active), len(instances)
        report.jobs_by_state.update(job.state.value for job in active.values())
        sweeps = StackSweeps(ports, self.jobs)
        try:
            sweeps.sweep_placement_groups(active, unreadable, report)  # first: a launch below may need a free group
        except Exception:
            log.exception("sweeping placement groups failed")
            report.count(Repair.ERRORS)

        alarms = self._idle_alarms()
        alarmed = None if alarms is None else {a.instance_id for a in alarms}
        silent = frozenset(a.instance_id for a in alarms or () if a.had_datapoints is False)
        watched: set[str] = set()
        throttled = self._reports_throttled_at(now, active.values())
        for job in active.values():  # survivors of a reclaimed gang go even if a RUNNING job's repairs wait
            self._guarded(job, report, lambda j: self._terminate_reclaimed_survivors(j, now, report))
            if job.state is not JobState.RUNNING and any(not a.is_over and a.instance_ids for a in job.attempts):
                self._guarded(job, report, lambda j: self._settle_between_attempts(j, by_job[j.job_id], report))
        running = sorted((j for j in active.values() if j.state is JobState.RUNNING), key=lambda j: j.updated_at)
        batch: dict[str, Job] = {}  # the chunk's records, read consistently just before its repairs
        for start in range(0, len(running), READ_BATCH):
            if near(REPAIR_RESERVE):
                report.count(Repair.RUNNING_REPAIRS_DEFERRED_TO_THE_NEXT_RUN, len(running) - start)
                watched.update(i for job in running[start:] for i in job.instance_ids)  # their alarms stay
                break
            chunk = running[start : start + READ_BATCH]
            batch.clear()
            batch.update(self._read_consistently(chunk))
            for job in chunk:
                self._guarded(
                    job,
                    report,
                    lambda j: watched.update(
                        self._repair_running(
                            j,
                            live=by_job[j.job_id],
                            now=now,
                            holds=holds,
                            alarms=(alarmed, silent),
                            report=report,
                            reports_throttled_at=throttled,
                            fresh=batch.get(j.job_id),
                        )
                    ),
                )
        if alarmed is not None:
            self._delete_leaked_alarms(alarmed - watched, report)
        sweeps.terminate_orphans(instances, active, unreadable, now, report)
        sweeps.delete_ended_jobs_security_groups(active, unreadable, by_job, report)
        LaunchWork(self.ports, self.jobs, self.reactions).run(
            active, now, report, out_of_time=lambda: near(LAUNCH_WORK_RESERVE), guarded=self._guarded
        )
        sweeps.delete_ended_jobs_objects(
            now, self.object_retention, report, out_of_time=lambda: near(retention.SWEEP_RESERVE)
        )
        return report

    def _active_jobs(self, report: ReconcileReport) -> tuple[dict[str, Job], set[str]]:
        """Every active job once, at the newest version any query returned it; and the ids of the
        active items this release could not read (skipped, logged with their key, counted)."""
        active: dict[str, Job] = {}
        unreadable: set[str] = set()

        def skip(error: UnreadableJobError) -> None:
            log.error("skipping the unreadable record of %s: %s", error.job_id, error.problem)
            report.count(Repair.UNREADABLE_RECORDS_SKIPPED)
            unreadable.add(error.job_id)

        for state in ACTIVE_STATES:
            for job in self.ports.store.list_by_state(state, limit=MAX_ACTIVE_JOBS, on_unreadable=skip):
                seen = active.get(job.job_id)
                if seen is None or job.version > seen.version:
                    active[job.job_id] = job
        return active, unreadable

    def _idle_alarms(self) -> list[IdleAlarmState] | None:
        """The idle alarms and their last evaluations; None when they cannot be listed now."""
        try:
            return self.ports.alarms.states()
        except Exception:
            log.exception("could not list the idle alarms")
            return None

    @staticmethod
    def _guarded(job: Job, report: ReconcileReport, repair: Callable[[Job], None]) -> None:
        """One job's failure is logged and counted; the run goes on with the others."""
        try:
            repair(job)
        except Exception:
            log.exception("reconciling %s failed", job.job_id)
            report.count(Repair.ERRORS)

    # ---- jobs that hold instances -----------------------------------------------------------------
    def _repair_running(
        self,
        job: Job,
        *,
        live: list[TaggedInstance],
        now: datetime,
        holds: list[BudgetPolicy],
        alarms: tuple[set[str] | None, frozenset[str]],
        report: ReconcileReport,
        reports_throttled_at: datetime | None = None,
        fresh: Job | None = None,
    ) -> set[str]:
        """Repair one RUNNING job; returns the instances whose idle alarms it wants kept. `alarms`:
        the instances with an idle alarm (None: unknown this tick), and those fed no GPU metric.
        `fresh`: the job as this run's batch read returned it (None: read it here). Each repair
        decides on the newest record this run knows (what the previous one wrote), and any write
        is conditional on its version, so a record changed meanwhile is read again, never overwritten."""
        alarmed, silent = alarms
        reactions = self.reactions
        current = fresh or self.ports.store.get(job.job_id)
        current = self._record_lost_state_changes(current, live, report)
        current = self._enforce_caps(current, now, holds, report)
        from gpujobs.domain.volatility import may_change_market  # with the moves it asks for: loaded on use

        if may_change_market(current):
            moved = reactions.keep_market(job.job_id, current=current)
            current = moved.job or current
            if moved.outcome is Outcome.MARKET_CHANGED:
                report.count(Repair.MARKET_MOVES)
        if current.state is JobState.RUNNING and current.current_attempt and current.current_attempt.regroup:
            regrouped = reactions.regroup(job.job_id, current=current)
            current = regrouped.job or current
            if regrouped.outcome is Outcome.INTERRUPTED:
                report.count(Repair.REGROUPS_GIVEN_UP)
        current = self._check_heartbeat(current, now, report, reports_throttled_at)
        settled = reactions.settle(job.job_id, current=current)
        if settled.outcome is Outcome.CHECKPOINT_RESENT:
            report.count(Repair.STOP_CHECKPOINTS_RESENT)
        elif settled.outcome is not Outcome.NOTHING_TO_DECIDE:
            report.count(Repair.ATTEMPTS_SETTLED)
        now_job = settled.job or current
        if silent.intersection(now_job.instance_ids):
            self._note_idle_detection_off(now_job.job_id, silent, report)
        return self._ensure_alarms(now_job, alarmed, report)

    def _note_idle_detection_off(self, job_id: str, silent: frozenset[str], report: ReconcileReport) -> None:
        """Tell the user, once per attempt, that an instance's idle alarm gets no GPU metric
        (`domain.idle_detection`): in the job's status, and as a `GPU Idle Detection Off` event."""
        clock = self.ports.clock
        applied = self.jobs.change(job_id, lambda j: note_idle_detection_off(j, silent=silent, now=clock.now()))
        if applied.decision.outcome is not Outcome.IDLE_DETECTION_OFF:
            return
        report.count(Repair.IDLE_DETECTION_OFF_NOTED)
        job, attempt = applied.after, applied.after.current_attempt
        log.warning("%s: %s", job_id, applied.decision.detail)
        try:
            self.ports.publisher.publish_notice(
                IDLE_DETECTION_OFF,
                {
                    "job_id": job_id,
                    "name": job.name,
                    "team": job.team,
                    "attempt": attempt.number if attempt else None,
                    "instance_ids": sorted(silent.intersection(job.instance_ids)),
                    "detail": applied.decision.detail,
                },
            )
        except Exception:
            log.exception("could not publish %s for %s", IDLE_DETECTION_OFF, job_id)

    def _record_lost_state_changes(self, job: Job, live: list[TaggedInstance], report: ReconcileReport) -> Job:
        """Record the instances EC2 no longer shows up (a lost state change); the job as it is now."""
        still_up = {i.instance_id for i in live if i.state not in GONE_STATES}
        for attempt in job.attempts:
            if attempt.is_over or not attempt.instance_ids:
                continue
            missing = tuple(i for i in attempt.instance_ids if i not in still_up and i not in attempt.gone)
            if not missing:
                continue
            recorded = self.reactions.record_gone(job.job_id, missing, current=job)
            job = recorded.job or job
            if recorded.outcome is Outcome.GONE_RECORDED:
                report.count(Repair.LOST_STATE_CHANGES_REPAIRED)
        return job

    def _read_consistently(self, jobs: list[Job]) -> dict[str, Job]:
        """One BatchGetItem for up to `READ_BATCH` jobs; on failure each job is read on its own."""
        try:
            return self.ports.store.get_many([job.job_id for job in jobs], on_unreadable=lambda _error: None)
        except Exception:
            log.warning("the batch read of %d jobs failed; reading them one by one", len(jobs), exc_info=True)
            return {}

    def _settle_between_attempts(self, job: Job, live: list[TaggedInstance], report: ReconcileReport) -> None:
        """A job between attempts may still hold an unfinished one (interrupted just before a budget
        hold or a capacity crunch sent it back to the queue): no event judges it again, so it is
        settled here like a RUNNING job's. A launch that follows waits for the launch work."""
        self._record_lost_state_changes(job, live, report)
        clock = self.ports.clock
        applied = self.jobs.change(job.job_id, lambda current: decisions.settle(current, now=clock.now()))
        self.jobs.carry_out(applied.decision.effects)
        if applied.decision.outcome is not Outcome.NOTHING_TO_DECIDE:
            report.count(Repair.ATTEMPTS_SETTLED)

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
            self.jobs.carry_out([CreateAlarms(job.job_id, lacking, idle.gpu_util_below_percent, idle.for_minutes)])
            report.count(Repair.IDLE_ALARMS_RECREATED, len(lacking))
        return set(live)

    def _delete_leaked_alarms(self, unwatched: set[str], report: ReconcileReport) -> None:
        """Alarms no RUNNING job watched this tick: deleted once the record says their attempt is over.
        Each is re-read, so an alarm a launch has just created is never taken for a leak; one whose
        instance the (eventually consistent) index does not know yet is left for a later tick."""
        store = self.ports.store
        leaked = []
        for iid in sorted(unwatched):
            try:
                job = store.find_by_instance(iid)
            except UnreadableJobError:
                continue  # its job's record says nothing this release can read: the alarm stays
            attempt = job.attempt_of_instance(iid) if job else None
            if job is not None and (attempt is None or attempt.is_over or job.state.is_terminal):
                leaked.append(iid)
        if leaked:
            self.jobs.carry_out([DeleteAlarms(tuple(leaked))])
            report.count(Repair.IDLE_ALARMS_DELETED, len(leaked))

    def _terminate_reclaimed_survivors(self, job: Job, now: datetime, report: ReconcileReport) -> None:
        """A reclaimed gang's rest, hung past the warning and a grace, and a moved attempt once its
        replacement is up: terminated (each tick until gone)."""
        for attempt in job.attempts:
            survivors = overdue_survivors(job, attempt, now=now)
            if survivors:
                log.warning("%s: attempt %d was reclaimed; terminating %s", job.job_id, attempt.number, survivors)
                self.jobs.carry_out([Terminate(tuple(survivors))])
                report.count(Repair.RECLAIMED_SURVIVORS_TERMINATED, len(survivors))

    def _reports_throttled_at(self, now: datetime, jobs: Iterable[Job]) -> datetime | None:
        """When the Reports function was last throttled (one read per tick, with a RUNNING job); None: unknown."""
        if not any(job.state is JobState.RUNNING for job in jobs):
            return None
        try:
            return self.ports.reports_throttled_at(now)
        except Exception:
            log.warning("could not read the Reports function's throttles", exc_info=True)
            return None

    def _check_heartbeat(
        self, job: Job, now: datetime, report: ReconcileReport, reports_throttled_at: datetime | None = None
    ) -> Job:
        """A trainer whose heartbeats stopped, or never started, for longer than its job allows is
        hung (`domain.hangs`): its ranks' stacks are asked for, then its gang is replaced. Silence
        while reports were throttled does not count."""
        applied = self.jobs.change(
            job.job_id, lambda fresh: on_hang(fresh, now=now, reports_throttled_at=reports_throttled_at), first=job
        )
        outcome = applied.decision.outcome
        if outcome is Outcome.HANG_DUMP_ASKED:
            log.warning("%s: %s", job.job_id, applied.decision.detail)
            report.count(Repair.HUNG_ATTEMPTS_DUMPED)
        elif outcome is Outcome.HUNG_GANG_TERMINATED:
            log.warning("%s: %s; terminating the gang", job.job_id, applied.decision.detail)
            report.count(Repair.HUNG_ATTEMPTS_TERMINATED)
        return self.jobs.act(applied)

    def _enforce_caps(self, job: Job, now: datetime, holds: list[BudgetPolicy], report: ReconcileReport) -> Job:
        """Ask a job past a budget hold, its runtime cap or its cost cap to stop; the job as it is now."""
        if job.state is not JobState.RUNNING or job.stop_request is not None:
            return job
        cap = self._cap_passed(job, now, holds)
        if cap is None:
            return job
        reason, detail, repair = cap
        asked = self.reactions.request_stop(job.job_id, reason, detail=detail, current=job)
        report.count(repair)
        return asked.job or job

    def _cap_passed(self, job: Job, now: datetime, holds: list[BudgetPolicy]) -> tuple[Reason, str, Repair] | None:
        hold = hold_over(job.team, holds)
        if hold is not None:
            return Reason.BUDGET_EXCEEDED, f"budget: {hold.reason}", Repair.BUDGET_HOLDS_ENFORCED
        spec = job.require_spec()
        runtime = runtime_of(job, now)
        if runtime >= timedelta(minutes=spec.max_runtime_minutes):
            detail = f"ran {runtime} of max_runtime_minutes {spec.max_runtime_minutes}"
            return Reason.MAX_RUNTIME, detail, Repair.RUNTIME_CAPS
        if spec.max_cost_usd is not None:
            cost = cost_of(job, now, self._hourly_prices(job))
            if cost >= spec.max_cost_usd:
                detail = f"spent about ${cost:.2f} of max_cost_usd ${spec.max_cost_usd:.2f}"
                return Reason.MAX_COST, detail, Repair.COST_CAPS
        return None

    def _hourly_prices(self, job: Job) -> dict[BilledPool, float]:
        """Each pool's price; a type the prices do not know counts high, never as free."""
        prices: dict[BilledPool, float] = {}
        for pool in billed_pools(job):
            known = self.ports.prices.hourly_usd(instance_type=pool.instance_type, market=pool.market, zone=pool.zone)
            prices[pool] = (
                known if known is not None else price_erring_high(pool.instance_type, self.ports.prices.on_demand_table)
            )
        return prices

    def _budget_holds(self, today: date, report: ReconcileReport) -> list[BudgetPolicy]:
        """Lift the policies that have lapsed; return the holds still in force."""
        budgets = self.ports.budgets
        holds: list[BudgetPolicy] = []
        for policy in budgets.held_scopes():
            try:
                rolled = period_rolled_over(policy.period, today)
            except ValueError:
                log.exception("budget policy of scope %s has a malformed period", policy.scope)
                report.count(Repair.ERRORS)
                rolled = False
            released = (rolled or (lifts_early(policy) and self.ports.budget_has_room(policy))) and budgets.release(
                policy
            )
            if released:
                report.count(Repair.BUDGET_HOLDS_RELEASED)
            elif policy.mode is BudgetMode.HOLD:
                holds.append(policy)
        return holds
