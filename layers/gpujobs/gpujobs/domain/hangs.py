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

A hung gang is dumped before it is killed (`on_hang`): the first tick that finds it hung asks every
node for the stacks of its ranks (`DumpStacks`: SIGUSR2 to the container, whose launcher runs
py-spy on each rank and uploads the dumps beside the job's outputs) and records when
(`hang_dump_asked_at`); a tick `HANG_DUMP_WAIT` later terminates the gang, dumped or not. The
record says whether this hang's dump was asked for (asked after its silence began), so a tick run
twice asks once, and a gang that hangs again after it recovered is dumped again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gpujobs.domain.effects import Decision, DumpStacks, Outcome, Terminate, ignore
from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.states import JobState, Reason

HANG_DUMP_WAIT = timedelta(minutes=2)
"""How long a hung gang is given for its dump (py-spy on each rank, then the upload) before it is
terminated: the reconciler runs once a minute, so the kill comes on the second or third tick."""


@dataclass(frozen=True)
class Hang:
    """A hung attempt: its live instances, and the limit its trainer passed (for the log)."""

    instance_ids: tuple[str, ...]
    why: str
    since: datetime
    """When the silence that makes it hung began: a dump asked for before it was for another hang."""


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
    why = f"{what} for over {_minutes(limit)} (since {since:%Y-%m-%d %H:%M} UTC)"
    return Hang(live, why, since) if live else None


def on_hang(job: Job, *, now: datetime, reports_throttled_at: datetime | None = None) -> Decision:
    """Dump first, kill after (see the module): ask the hung gang for its stacks and note when, or,
    `HANG_DUMP_WAIT` after this hang's dump was asked for, terminate it. Not hung: nothing."""
    hang = hang_of(job, now=now, reports_throttled_at=reports_throttled_at)
    attempt = job.current_attempt
    if hang is None or attempt is None:
        return ignore(Outcome.NOT_HUNG)
    asked = attempt.hang_dump_asked_at
    if asked is None or asked < hang.since:
        noted = job.with_attempt(attempt.model_copy(update={"hang_dump_asked_at": now}), now=now)
        dump = DumpStacks(hang.instance_ids, attempt.container_name(job.job_id))
        return Decision(Outcome.HANG_DUMP_ASKED, noted, (dump,), f"{hang.why}; stacks asked for first")
    if now - asked < HANG_DUMP_WAIT:
        return ignore(Outcome.HANG_DUMP_AWAITED, f"{hang.why}; its dump was asked for at {asked:%H:%M:%S} UTC")
    return Decision(Outcome.HUNG_GANG_TERMINATED, effects=(Terminate(hang.instance_ids),), detail=hang.why)


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
