"""When a job's objects in the checkpoint bucket go: `CheckpointRetentionDays` after it ended.

Everything a job stores is under its own prefix (`job_access.job_prefix`: its run documents, its
`code:` archive, its checkpoints, a `directory` job's blobs and manifests). A bucket lifecycle rule
counts from each object's creation, so it expired the blobs a `directory` job had not changed for
30 days, and its `code:` archive, while the job still ran: it could no longer restore (issue 19,
item 12). Expiry now counts from the job's end and is done by the reconciler: an ended job whose
objects are still kept is listed by the time it ended (the table's sparse `ByEnd` index), its
prefix is deleted once `retention` has passed, and the record notes when (`objects_deleted_at`),
which takes it out of the index. An active job's objects are never deleted, however old.

The bucket is versioned: what is deleted stays recoverable as noncurrent versions for
`NoncurrentVersionRetentionDays`. A `STOPPED` job has ended too; its checkpoints go like any other's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpujobs.domain.effects import Decision, Outcome, ignore
from gpujobs.domain.job import Job

OBJECT_RETENTION = timedelta(days=30)
"""The template's `CheckpointRetentionDays` default."""
SWEEP_RESERVE = timedelta(seconds=10)
"""The sweep starts no job's deletion with less than this left of the reconciler's run."""
JOBS_SWEPT_PER_RUN = 50
"""Ended jobs one reconciler run deletes the objects of, oldest end first (the rest wait a minute)."""
KEYS_DELETED_PER_JOB = 10_000
"""Objects one run deletes for one job (ten DeleteObjects calls); a bigger prefix goes on next run."""


def ended_at(job: Job) -> datetime | None:
    """When the job reached its terminal state (None while it is active)."""
    if not job.state.is_terminal:
        return None
    for entry in reversed(job.history):
        if entry.target.is_terminal:
            return entry.at
    return job.updated_at  # its history no longer holds the transition: never earlier than the end


def objects_kept(job: Job) -> bool:
    """The job has ended and its objects have not been deleted: it is in the `ByEnd` index."""
    return job.state.is_terminal and job.objects_deleted_at is None


def objects_due(job: Job, *, now: datetime, retention: timedelta) -> bool:
    """The job ended at least `retention` ago and its objects are still kept."""
    end = ended_at(job)
    return objects_kept(job) and end is not None and now - end >= retention


def objects_deleted(job: Job, *, now: datetime, retention: timedelta) -> Decision:
    """Note on the record that the job's objects were deleted (after the sweep emptied its prefix)."""
    if not objects_due(job, now=now, retention=retention):
        return ignore(Outcome.ALREADY_HANDLED, "the job is active, or its objects are gone or not due")
    noted = job.model_copy(update={"objects_deleted_at": now, "updated_at": now})
    return Decision(Outcome.OBJECTS_DELETED, noted, detail=f"objects deleted {retention.days} days after the end")
