"""When a running trainer counts as hung: its heartbeats stopped, or never started, for longer than
its job allows.

A trainer reports a heartbeat every `trainer.heartbeat_seconds` from its step boundary, and from a
keep-alive thread while the script says it is busy (`run.busy()`: a long evaluation, save or
compile). One that reported and then went silent for `trainer.heartbeat_overdue_minutes` is stuck
(a collective waiting for a peer that will never come, a deadlocked loader). One that has not
reported its first heartbeat `trainer.first_heartbeat_minutes` after its attempt started is stuck
before training began (NCCL or EFA initialisation waiting on a peer, an image pull that never
ends): without this limit only `max_runtime_minutes` (a day by default) would end it. Either way
its gang is terminated and the attempt ends like any lost gang, so the job resumes from its last
checkpoint.

The first-heartbeat limit holds only for a job whose script uses the trainer library (`checkpoint:
gpujobs`), which reports from its first step boundary on: a `directory` or `none` script may never
report, and until it does only the runtime and cost caps bound it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState


@dataclass(frozen=True)
class Hang:
    """A hung attempt: its live instances, and the limit its trainer passed (for the log)."""

    instance_ids: tuple[str, ...]
    why: str


def hang_of(job: Job, *, now: datetime) -> Hang | None:
    """The current attempt of a RUNNING job if its trainer is hung (see the module); None otherwise."""
    attempt = job.current_attempt
    if job.state is not JobState.RUNNING or attempt is None or attempt.is_over:
        return None
    spec = job.require_spec()
    if attempt.last_heartbeat_at is None:
        if not spec.checkpoint.takes_checkpoint_requests:
            return None
        limit, since, what = spec.trainer.first_heartbeat, attempt.started_at, "no first heartbeat"
    else:
        limit, since, what = spec.trainer.heartbeat_overdue, attempt.last_heartbeat_at, "no heartbeat"
    if now - since < limit:
        return None
    live = tuple(i for i in attempt.instance_ids if i not in attempt.gone)
    return Hang(live, f"{what} for over {_minutes(limit)} (since {since:%Y-%m-%d %H:%M} UTC)") if live else None


def _minutes(limit: timedelta) -> str:
    return f"{int(limit.total_seconds() // 60)} min"
