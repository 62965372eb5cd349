"""The reconciler's stack-wide sweeps: orphan instances, placement groups and security groups that
no active attempt accounts for, and the objects of jobs long ended (`service.reconcile` runs them
once a pass; its docstring says when).

Each acts only after a consistent read of the job agrees: the `ByState` index the pass lists from
is eventually consistent, and a launch creates its group or instances right after its claim is
saved. A job whose record this release cannot read (`unreadable`) keeps everything.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpujobs.contract import STOPPED_STATES, UP_STATES
from gpujobs.domain import keep, retention
from gpujobs.domain.effects import Outcome, Terminate
from gpujobs.domain.job import Job
from gpujobs.domain.job_access import job_prefix
from gpujobs.domain.states import ACTIVE_STATES, JobState
from gpujobs.service.jobs import JobService
from gpujobs.service.ports import JobNotFoundError, Ports, TaggedInstance, UnreadableJobError
from gpujobs.service.repairs import ReconcileReport, Repair

log = logging.getLogger(__name__)

ORPHAN_GRACE = timedelta(minutes=10)
"""An instance younger than this may belong to a launch whose record is being written."""


@dataclass(frozen=True)
class StackSweeps:
    ports: Ports
    jobs: JobService
    """For the actuator: an orphan's Terminate is an effect like any other (counted if it fails)."""

    def terminate_orphans(
        self,
        instances: list[TaggedInstance],
        active: dict[str, Job],
        unreadable: set[str],
        now: datetime,
        report: ReconcileReport,
    ) -> None:
        suspects: dict[str, list[TaggedInstance]] = defaultdict(list)
        for inst in instances:
            if inst.job_id in unreadable:
                continue  # its job may well be running them: nothing here can tell
            if now - inst.launched_at >= ORPHAN_GRACE and _is_orphan(active.get(inst.job_id), inst, now):
                suspects[inst.job_id].append(inst)
        orphans: list[str] = []
        for job_id, candidates in suspects.items():
            try:
                fresh = self.consistent_read(job_id)
            except UnreadableJobError:
                report.count(Repair.ORPHANS_SPARED_BY_A_CONSISTENT_READ, len(candidates))
                continue
            confirmed = [i.instance_id for i in candidates if _is_orphan(fresh, i, now)]
            if len(confirmed) < len(candidates):
                report.count(Repair.ORPHANS_SPARED_BY_A_CONSISTENT_READ, len(candidates) - len(confirmed))
            orphans += confirmed
        if orphans:
            log.warning("terminating %d orphan instance(s): %s", len(orphans), orphans)
            self.jobs.carry_out([Terminate(tuple(orphans))])
            report.count(Repair.ORPHANS_TERMINATED, len(orphans))

    def sweep_placement_groups(self, active: dict[str, Job], unreadable: set[str], report: ReconcileReport) -> None:
        """Delete the groups of ended attempts and jobs: a Region holds only 500 placement groups.

        A group whose attempt looks unfinished in the active view is kept; any other is re-read
        consistently first (the view is eventually consistent, and a launch creates its group right
        after its claim is saved). A group still holding instances is retried on the next tick.
        """
        for group in self.ports.compute.list_placement_groups():
            if group.job_id in unreadable or _attempt_unfinished(active.get(group.job_id), group.attempt):
                continue
            try:
                if _attempt_unfinished(self.consistent_read(group.job_id), group.attempt):
                    continue
            except UnreadableJobError:
                continue
            if self.ports.compute.delete_placement_group(group.name):
                report.count(Repair.PLACEMENT_GROUPS_DELETED)

    def delete_ended_jobs_security_groups(
        self,
        active: dict[str, Job],
        unreadable: set[str],
        by_job: dict[str, list[TaggedInstance]],
        report: ReconcileReport,
    ) -> None:
        """A job's security group outlives its instances by up to a minute: EC2 refuses to delete a
        group an interface still uses, so it goes here once the job is over (by a consistent read:
        a group created for a launch the index does not show yet is never taken) and nothing of the
        job is left. Stopped instances a STOPPED job keeps also keep their group."""
        compute = self.ports.compute
        for group in compute.job_security_groups():
            if group.job_id in active or group.job_id in unreadable or by_job.get(group.job_id):
                continue
            try:
                job = self.consistent_read(group.job_id)
            except UnreadableJobError:
                continue
            if job is not None and job.state in ACTIVE_STATES:
                continue
            if compute.delete_security_group(group.group_id):
                report.count(Repair.JOB_SECURITY_GROUPS_DELETED)

    def delete_ended_jobs_objects(
        self, now: datetime, kept_for: timedelta, report: ReconcileReport, *, out_of_time: Callable[[], bool]
    ) -> None:
        """The objects of jobs that ended `kept_for` ago, oldest end first (`domain.retention`): the
        job's prefix is emptied, then the record notes it, which takes the job out of the `ByEnd`
        index. A prefix too big for one run, a failed call or a lost race is taken up next run."""
        try:
            ended = self.ports.store.list_ended(before=now - kept_for, limit=retention.JOBS_SWEPT_PER_RUN)
        except Exception:
            log.exception("could not list the ended jobs whose objects are kept")
            report.count(Repair.ERRORS)
            return
        for job in ended:
            if out_of_time():
                return
            if not retention.objects_due(job, now=now, retention=kept_for):
                continue  # the index's copy is behind: the record says otherwise
            try:
                if not self.ports.blobs.delete_prefix(job_prefix(job.job_id), max_keys=retention.KEYS_DELETED_PER_JOB):
                    continue
                applied = self.jobs.change(
                    job.job_id, lambda j: retention.objects_deleted(j, now=now, retention=kept_for)
                )
            except Exception:
                log.exception("deleting the objects of %s failed", job.job_id)
                report.count(Repair.ERRORS)
                continue
            if applied.decision.outcome is Outcome.OBJECTS_DELETED:
                report.count(Repair.ENDED_JOBS_OBJECTS_DELETED)

    def consistent_read(self, job_id: str) -> Job | None:
        try:
            return self.ports.store.get(job_id)
        except JobNotFoundError:
            return None


def _is_orphan(job: Job | None, inst: TaggedInstance, now: datetime) -> bool:
    """An instance no active attempt accounts for: its job is unknown or over, its attempt unknown,
    or its attempt ended while the instance still runs, or it left its attempt's gang in a regroup
    whose warning window and grace are over (`domain.regroup.left_the_gang`), or it is a replacement
    a regroup launched but never recorded, of an attempt the job has since moved on from (the regroup
    was given up: no later regroup of that attempt can record it). The stopped instances
    of the last attempt of a job that ended STOPPED are kept on purpose (see the module docstring), and
    so is a FAILED job's gang kept for inspection until its keep is over (`domain.keep`)."""
    if job is not None and keep.spares(job, inst.attempt, now=now):
        return False
    if job is not None and job.state is JobState.STOPPED and inst.state in STOPPED_STATES:
        current = job.current_attempt
        return current is None or current.number != inst.attempt
    if job is None or job.state.is_terminal:
        return True
    attempt = job.attempt(inst.attempt)
    if (
        attempt is not None
        and not attempt.is_over
        and not job.is_current(attempt)
        and inst.instance_id not in (*attempt.instance_ids, *attempt.left)
        and inst.state in UP_STATES
    ):
        return True  # a replacement its regroup never recorded, of an attempt the job has moved on from
    if attempt is not None and not attempt.is_over and attempt.left and inst.state in UP_STATES:
        from gpujobs.domain.regroup import left_the_gang  # a regrouped gang's only

        return left_the_gang(attempt, inst.instance_id, now=now)
    return attempt is None or (attempt.is_over and inst.state in UP_STATES)


def _attempt_unfinished(job: Job | None, number: int) -> bool:
    attempt = job.attempt(number) if job is not None else None
    return job is not None and not job.state.is_terminal and attempt is not None and not attempt.is_over
