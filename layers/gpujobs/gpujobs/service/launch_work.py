"""The reconciler's launch work: the admission round, then every launch that is due.

Most urgent first: replacements of interrupted jobs, launches stuck past their lease, then queued
jobs whose next try is due, longest-waiting first (so that the jobs a short run did not reach go
first next time). Before them, the admission round (`service.admitting`) lets the waiting jobs whose
turn came in; a job that waits for admission is due only once it is admitted. The work stops when
the run is out of time; what is left waits for the next run, so a crowd of queued jobs in a capacity
crunch never starves the repairs before it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from gpujobs.domain.job import Job
from gpujobs.domain.ledger import waits
from gpujobs.domain.states import JobState
from gpujobs.service.jobs import JobService
from gpujobs.service.ports import Ports
from gpujobs.service.reactions import Reactions
from gpujobs.service.repairs import ReconcileReport, Repair

log = logging.getLogger(__name__)

Guarded = Callable[[Job, ReconcileReport, Callable[[Job], None]], None]


@dataclass(frozen=True)
class LaunchWork:
    ports: Ports
    jobs: JobService
    reactions: Reactions

    def run(
        self,
        active: dict[str, Job],
        now: datetime,
        report: ReconcileReport,
        *,
        out_of_time: Callable[[], bool],
        guarded: Guarded,
    ) -> None:
        admitted = self._admission_round(active, now, report)
        work = launch_work(active.values(), now, admitted)
        for done, job in enumerate(work):
            if out_of_time():
                report.count(Repair.LAUNCHES_DEFERRED_TO_THE_NEXT_RUN, len(work) - done)
                break
            guarded(job, report, lambda j: self._launch(j, report))

    def _admission_round(self, active: dict[str, Job], now: datetime, report: ReconcileReport) -> set[str]:
        """Who of the waiting jobs starts, and who is preempted (`service.admitting`); the admitted."""
        from gpujobs.service.admitting import Admitting

        try:
            return Admitting(self.ports, self.jobs, self.reactions).run(active, now, report)
        except Exception:
            log.exception("the admission round failed")
            report.count(Repair.ERRORS)
            return set()

    def _launch(self, job: Job, report: ReconcileReport) -> None:
        launched = self.jobs.launch(job.job_id)
        if job.state is JobState.INTERRUPTED:
            report.count(Repair.REPLACEMENTS_LAUNCHED)
        elif job.state is JobState.LAUNCHING:
            report.count(Repair.STUCK_LAUNCHES_TAKEN_OVER)
        elif launched.state is not JobState.QUEUED or launched.version != job.version:
            report.count(Repair.QUEUED_JOBS_RETRIED)


def launch_work(jobs: Iterable[Job], now: datetime, admitted: set[str]) -> list[Job]:
    """The jobs due a launch, most urgent first (see the module docstring)."""
    replacements: list[Job] = []
    stuck: list[Job] = []
    queued: list[Job] = []
    for job in jobs:
        attempt = job.current_attempt
        if job.state is JobState.INTERRUPTED:
            replacements.append(job)
        elif job.state is JobState.LAUNCHING:
            if attempt and attempt.lease_expires_at and attempt.lease_expires_at <= now:
                stuck.append(job)
        elif (
            job.state is JobState.QUEUED
            and (job.next_try_at is None or job.next_try_at <= now)
            and (not waits(job) or job.job_id in admitted)
        ):
            queued.append(job)
    queued.sort(key=lambda j: j.next_try_at or j.updated_at)
    return [*replacements, *stuck, *queued]
