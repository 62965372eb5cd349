"""One gang per attempt: when a gang's leftovers must go so that no attempt ever runs two.

Two ways a gang ends up broken. A launcher that crashed after RunInstances leaves a gang that
nobody recorded; if some of its nodes died before the takeover finds it, the takeover holds a
partial gang that can never train (every rank must join), and relaunching under the same client
tokens would only get the same broken reservation back from EC2. And when spot reclaims one node of
a gang, the replacement launches at once while the rest of the old gang saves its checkpoint; a
trainer that hangs instead of exiting would keep those survivors, and the replacement waiting on
them, alive forever. These are the pure answers; the launcher and the reconciler act on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from gpujobs.domain.job import Attempt, Job

SPOT_WARNING_WINDOW = timedelta(minutes=2)
"""EC2's notice before it reclaims a spot instance."""
RECLAIM_GRACE = timedelta(minutes=3)
"""How long past the warning window the survivors of a reclaimed gang may take to save and exit."""


PARTIAL_GANG = "partial-gang"
"""End reason of an attempt whose unrecorded gang a takeover found incomplete."""


def placement_group_of(job: Job, attempt: Attempt) -> str | None:
    """The cluster placement group a multi-node attempt launches into: one per attempt, because a
    cluster group lives in one zone and a replacement may boot elsewhere while the old gang saves."""
    return f"gpujobs-{job.job_id}-a{attempt.number}" if job.require_spec().nodes > 1 else None


def is_partial_gang(found: Sequence[object], *, nodes: int) -> bool:
    """Some, but not all, of an attempt's gang is alive: it cannot train and must not be adopted."""
    return 0 < len(found) < nodes


def overdue_survivors(job: Job, attempt: Attempt, *, now: datetime) -> tuple[str, ...]:
    """Instances of a reclaimed attempt still up after the warning window plus the grace.

    An attempt a deadline moved (`Attempt.moved`) is whole and training: it is taken only once a
    later attempt's gang is up (make before break), unless it lost a node meanwhile (then its rest
    can only hang, as a reclaimed gang's)."""
    if attempt.interrupted_at is None or attempt.is_over:
        return ()
    if now - attempt.interrupted_at < SPOT_WARNING_WINDOW + RECLAIM_GRACE:
        return ()
    if attempt.moved and not attempt.gone and not _replaced(job, attempt):
        return ()
    return tuple(i for i in attempt.instance_ids if i not in attempt.gone)


def _replaced(job: Job, attempt: Attempt) -> bool:
    """A later attempt of the job has its gang recorded."""
    return any(later.number > attempt.number and later.instance_ids for later in job.attempts)


def started_over(job: Job, survivors: Sequence[str], *, now: datetime, lease: timedelta) -> Job:
    """The job after a takeover terminated its current attempt's partial gang: that attempt ends
    holding the survivors (their time still counts), and a fresh attempt, with fresh client tokens
    (EC2 would answer the old ones with the broken reservation), carries the launch on."""
    attempt = job.current_attempt
    assert attempt is not None
    ended = attempt.model_copy(
        update={"instance_ids": tuple(survivors), "ended_at": now, "end_reason": PARTIAL_GANG, "lease_expires_at": None}
    )
    fresh = Attempt(
        number=attempt.number + 1, started_at=now, resume_from_step=job.checkpoint_step, lease_expires_at=now + lease
    )
    detail = f"attempt {attempt.number} found {len(survivors)} of {job.require_spec().nodes} nodes: starting over"
    restarted = job.with_attempt(ended, now=now).with_attempt(fresh, now=now)
    return restarted.model_copy(update={"status_detail": detail})
