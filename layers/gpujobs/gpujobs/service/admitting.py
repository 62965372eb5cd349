"""The reconciler's admission round: which waiting jobs start this minute, and what is preempted.

Once a tick, on the active jobs the run listed: jobs of a release before the GPU ledger are counted
in it (`launching.enroll`, a bounded number a run); then the team configuration is read afresh (a
quota, a pause or a drain takes effect within a minute) with the ledger, and the pure plan
(`domain.admission.plan`) says who is admitted and who is preempted. A job a budget policy holds
is left out (it waits for the policy first, holding nobody's room). Each admission is one
conditional write of the job and the ledger together: one the ledger refuses (another admission
took the room since the ledger was read) ends the round, and the next tick plans again on what is
then true. Admitted jobs are launched by the run's launch work, which comes after; preempted
running jobs are asked to stop after a checkpoint (`decisions.request_stop`, reason `preempted`),
and a queued one that holds borrowed GPUs gives them back at once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpujobs.domain.admission import plan
from gpujobs.domain.budget import BudgetPolicy, launch_hold
from gpujobs.domain.effects import Decision, Outcome
from gpujobs.domain.job import Admission, Job
from gpujobs.domain.launching import admit, enroll, requeue_preempted, settle_ledger
from gpujobs.domain.ledger import holds, off_the_ledger, waits
from gpujobs.domain.states import JobState, Reason
from gpujobs.service.jobs import JobService
from gpujobs.service.ports import AdmissionRefusedError, Ports
from gpujobs.service.reactions import Reactions
from gpujobs.service.repairs import ReconcileReport, Repair

log = logging.getLogger(__name__)

ENROLLED_PER_RUN = 500
"""Jobs of an older release counted in the ledger per run: an upgrade's backlog takes a few ticks."""
SETTLED_AFTER_END = timedelta(hours=1)
"""How long after their end the jobs an older release ended are looked at again."""


@dataclass
class Admitting:
    ports: Ports
    jobs: JobService
    reactions: Reactions
    _policies: dict[str, BudgetPolicy] = field(default_factory=dict)

    def run(self, active: Mapping[str, Job], now: datetime, report: ReconcileReport) -> set[str]:
        """One admission round; returns the ids of the jobs it admitted (the launch work's to launch)."""
        enrolled = self._enroll(active, now, report)
        jobs = {**active, **enrolled, **self._settle_ledger(active, now, report)}
        directory = self.jobs.load_team_directory()
        ledger = self.ports.store.ledger()
        waiting = [job for job in jobs.values() if waits(job) and self._launchable(job, now)]
        holders = [job for job in jobs.values() if holds(job)]
        decided = plan(waiting, holders, ledger, directory, now)
        report.team_gpus.update(
            {team: (ledger.team(team), directory.quota(team).gpus) for team in set(directory.teams) | ledger.teams()}
        )
        admitted: set[str] = set()
        for job_id, admission in decided.admit:
            try:
                applied = self.jobs.change(job_id, functools.partial(_admit, admission=admission, now=now))
            except AdmissionRefusedError as exc:
                log.info("admission round ends: %s", exc)
                report.count(Repair.ADMISSIONS_REFUSED)
                break
            if applied.decision.outcome is Outcome.ADMITTED:
                admitted.add(job_id)
                report.count(Repair.JOBS_ADMITTED)
        for job_id in decided.preempt:
            self._preempt(jobs[job_id], now, report)
        return admitted

    def _launchable(self, job: Job, now: datetime) -> bool:
        """Not held by a budget policy: a held job waits for the policy first, holding nobody's room."""
        policy = self._policies.get(job.team)
        if policy is None:
            policy = self._policies[job.team] = self.ports.budgets.policy_for(job.team)
        return launch_hold(job, policy, now=now) is None

    def _settle_ledger(self, active: Mapping[str, Job], now: datetime, report: ReconcileReport) -> dict[str, Job]:
        """Records an older release wrote while both ran (an upgrade, a rollback): the active ones the
        run listed, and the ones that ended in the last `SETTLED_AFTER_END` (no later write comes to them)."""
        drifted = [j for j in active.values() if off_the_ledger(j)]
        drifted += [
            j
            for j in self.ports.store.list_ended_after(now - SETTLED_AFTER_END, limit=ENROLLED_PER_RUN)
            if off_the_ledger(j)
        ]
        settled: dict[str, Job] = {}
        for job in drifted[:ENROLLED_PER_RUN]:
            try:
                applied = self.jobs.change(job.job_id, settle_ledger)
            except Exception:
                log.exception("could not count %s in the GPU ledger again", job.job_id)
                report.count(Repair.ERRORS)
                continue
            if applied.decision.outcome is Outcome.LEDGER_SETTLED:
                if not applied.after.state.is_terminal:
                    settled[job.job_id] = applied.after
                report.count(Repair.LEDGER_SETTLED)
        return settled

    def _enroll(self, active: Mapping[str, Job], now: datetime, report: ReconcileReport) -> dict[str, Job]:
        enrolled: dict[str, Job] = {}
        for job in [j for j in active.values() if not j.counted and j.spec is not None][:ENROLLED_PER_RUN]:
            try:
                applied = self.jobs.change(job.job_id, lambda j: enroll(j, now=now))
            except Exception:
                log.exception("could not count %s in the GPU ledger", job.job_id)
                report.count(Repair.ERRORS)
                continue
            if applied.decision.outcome is Outcome.ENROLLED:
                enrolled[job.job_id] = applied.after
                report.count(Repair.JOBS_ENROLLED)
        return enrolled

    def _preempt(self, job: Job, now: datetime, report: ReconcileReport) -> None:
        borrowed = job.admission.borrowed if job.admission is not None else 0
        detail = f"preempted: its {borrowed} borrowed GPU(s) are wanted back by the team that lent them"
        try:
            if job.state is JobState.RUNNING:
                outcome = self.reactions.request_stop(job.job_id, Reason.PREEMPTED, detail=detail).outcome
            else:
                requeued = self.jobs.change(job.job_id, lambda j: requeue_preempted(j, now=now, detail=detail))
                outcome = requeued.decision.outcome
        except Exception:
            log.exception("could not preempt %s", job.job_id)
            report.count(Repair.ERRORS)
            return
        if outcome in (Outcome.STOP_REQUESTED, Outcome.PREEMPTED):
            report.count(Repair.PREEMPTIONS_REQUESTED)


def _admit(job: Job, *, admission: Admission, now: datetime) -> Decision:
    return admit(job, admission, now=now)
