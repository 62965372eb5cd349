"""When a running trainer counts as hung: its heartbeats stopped, or never started, for longer than
its job allows.

A trainer reports a heartbeat every `trainer.heartbeat_seconds` from its step boundary, and from a
keep-alive thread while the script says it is busy (`run.busy()`: a long evaluation, save or
compile). One that reported and then went silent for `trainer.heartbeat_overdue_minutes` is stuck
(a collective waiting for a peer that will never come, a deadlocked loader). One that has not
reported its first heartbeat `trainer.first_heartbeat_minutes` after its attempt started is stuck
before training began (NCCL or EFA initialisation waiting on a peer, an image pull that never
ends): without this limit only `max_runtime_minutes` (a day by default) would end it. A gang that
regrouped (`domain.regroup`: a node replaced in place) starts again like a new one: its first
heartbeat after the replacement's launch is held to the same limit. Either way
its gang is terminated and the attempt ends like any lost gang, so the job resumes from its last
checkpoint.

The first-heartbeat limit holds only for a job whose script uses the trainer library (`checkpoint:
gpujobs`), which reports from its first step boundary on: a `directory` or `none` script may never
report, and until it does only the runtime and cost caps bound it.

A heartbeat that could not arrive is no sign of a hang: while the Reports function is throttled
(a flood of reports from any job, the account's concurrency spent elsewhere) every trainer's
heartbeats wait in Lambda's queue. So silence is counted from the later of the last heartbeat (or
the attempt's start) and the last minute the reports path was seen throttled (`reports_throttled_at`,
read by the reconciler once per tick): no job is judged hung for a silence the control plane caused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.states import JobState, Reason


@dataclass(frozen=True)
class Hang:
    """A hung attempt: its live instances, and the limit its trainer passed (for the log)."""

    instance_ids: tuple[str, ...]
    why: str


def hang_of(job: Job, *, now: datetime, reports_throttled_at: datetime | None = None) -> Hang | None:
    """The current attempt of a RUNNING job if its trainer is hung (see the module); None otherwise.
    `reports_throttled_at`: the end of the newest minute the Reports function was throttled (None:
    not lately, or unknown); silence before it does not count."""
    attempt = job.current_attempt
    if job.state is not JobState.RUNNING or attempt is None or attempt.is_over:
        return None
    spec = job.require_spec()
    regroup = attempt.regroup
    if attempt.waits_for_replacement:
        return None  # the gang waits for a node's launch, bounded by `regroup.LAUNCH_LIMIT`
    regrouped_at = regroup.launched_at if regroup is not None else None
    if attempt.last_heartbeat_at is None:
        if not spec.checkpoint.takes_checkpoint_requests:
            return None
        limit, since, what = spec.trainer.first_heartbeat, launched_at(job, attempt), "no first heartbeat"
    elif regrouped_at is not None and attempt.last_heartbeat_at < regrouped_at:
        limit, since, what = spec.trainer.first_heartbeat, regrouped_at, "no first heartbeat after the gang regrouped"
    else:
        limit, since, what = spec.trainer.heartbeat_overdue, attempt.last_heartbeat_at, "no heartbeat"
    if reports_throttled_at is not None and reports_throttled_at > since:
        since, what = reports_throttled_at, f"{what} after the reports path was last throttled"
    if now - since < limit:
        return None
    live = tuple(i for i in attempt.instance_ids if i not in attempt.gone)
    return Hang(live, f"{what} for over {_minutes(limit)} (since {since:%Y-%m-%d %H:%M} UTC)") if live else None


def launched_at(job: Job, attempt: Attempt) -> datetime:
    """When the attempt's gang was recorded (its `instances-launched` transition), not when its
    launch was claimed: a walk paused at one invocation's deadline after another, or waiting for
    capacity, launches its gang long after the claim, and its trainer's first-heartbeat clock
    starts at the launch. The claim's time when the history no longer holds the transition."""
    for entry in reversed(job.history):
        if entry.attempt == attempt.number and entry.reason is Reason.INSTANCES_LAUNCHED:
            return max(entry.at, attempt.started_at)
    return attempt.started_at


def _minutes(limit: timedelta) -> str:
    return f"{int(limit.total_seconds() // 60)} min"
