"""When a running trainer counts as hung: its heartbeats stopped for longer than its job allows.

A trainer reports a heartbeat every `trainer.heartbeat_seconds` from its step boundary, and from a
keep-alive thread while the script says it is busy (`run.busy()`: a long evaluation, save or
compile). One that reported and then went silent for `trainer.heartbeat_overdue_minutes` is stuck
(a collective waiting for a peer that will never come, a deadlocked loader): its gang is
terminated and the attempt ends like any lost gang, so the job resumes from its last checkpoint.
A trainer that never reported (compiling its first step, or a script that does not use the
trainer library) is not judged here; the runtime and cost caps still bound it.
"""

from __future__ import annotations

from datetime import datetime

from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState


def hung_instances(job: Job, *, now: datetime) -> tuple[str, ...]:
    """The live instances of a RUNNING job whose trainer's heartbeat is overdue; () when none is."""
    attempt = job.current_attempt
    if job.state is not JobState.RUNNING or attempt is None or attempt.is_over:
        return ()
    if attempt.last_heartbeat_at is None:
        return ()
    if now - attempt.last_heartbeat_at < job.require_spec().trainer.heartbeat_overdue:
        return ()
    return tuple(i for i in attempt.instance_ids if i not in attempt.gone)
