"""Pure decisions for reacting to the cloud: spot warnings, reports, instance fate, policy stops.

Each function takes the job record, the time and the observation, and answers with a `Decision`
(see `domain.effects`): the new record, the effects to carry out after it is written, an outcome.
Nothing here reads a clock or calls AWS, so the service can retry a decision on a fresh record
after a lost race, and the reconciler can take the same decision a minute later, with the same
answer. Observations are recorded first; `settle` then judges every unfinished attempt from the
whole record (`domain.fate`), so an event that arrives twice, late or out of order changes nothing
the second time.

Effects that matter for money are level-triggered: while a due policy stop still has live
instances on record, every settle issues the Stop/Terminate again, so a failed call is retried by
the next event or reconciler tick instead of being forgotten behind `executed_at`. So is the stop's
checkpoint-now: while a stop waits for a commit newer than its request, a settle re-sends it once
`CHECKPOINT_RESEND_INTERVAL` has passed since the last one, so a death after the stop's write or one
failed SendCommand costs minutes, not the steps trained since the last commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from gpujobs.contract import ExitCode
from gpujobs.domain.effects import (
    Decision,
    DeleteAlarms,
    Effect,
    Launch,
    Outcome,
    SignalCheckpoint,
    Stop,
    Terminate,
    ignore,
    live_instances,
)
from gpujobs.domain.fate import (
    HARDWARE_EXIT_CODES,
    PREEMPTION_GRACE,
    STOP_CHECKPOINT_DEADLINE,
    Verdict,
    interruption_moves,
    judge_attempt,
    moves_for,
    stop_is_due,
)
from gpujobs.domain.job import Attempt, Job, Market, StopRequest, cap_detail
from gpujobs.domain.keep import keep_or_terminate
from gpujobs.domain.progress import ProgressPoint
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport, Report
from gpujobs.domain.spec import IdleAction
from gpujobs.domain.states import JobState, Reason

REBALANCE_SIGNAL_INTERVAL = timedelta(minutes=5)
CHECKPOINT_RESEND_INTERVAL = timedelta(minutes=2)
"""A pending stop's checkpoint-now is sent again when no newer commit is recorded this long after the
last one was sent: two reconciler ticks, well inside the stop's 10 min. A request that reaches a
trainer while it saves is served by that save (the trainer coalesces them), so one sent again
while the first is being answered costs nothing."""
HEARTBEAT_RECORD_INTERVAL = timedelta(seconds=30)
"""An attempt's heartbeats are written at most once per this (or per its own period, if shorter)."""
RATE_LIMITED_METRIC = "ReportsRateLimited"
STOP_METRIC = {Reason.IDLE: "IdleStops", Reason.BUDGET_EXCEEDED: "BudgetStops", Reason.PREEMPTED: "Preemptions"}


def running_attempt(job: Job, instance_id: str) -> Attempt | None:
    """The attempt of `instance_id` if it is the job's current, unfinished attempt of a RUNNING job:
    the only attempt a warning, a rebalance or an idle alarm can still act on."""
    attempt = job.attempt_of_instance(instance_id)
    if attempt is None or attempt.is_over or not job.is_current(attempt) or job.state is not JobState.RUNNING:
        return None
    return attempt


def checkpoint_signals(job: Job, attempt: Attempt) -> tuple[Effect, ...]:
    """Send "checkpoint now" (SIGUSR1) only to a job whose script asked for it (`checkpoint: gpujobs`).

    Any other script would be killed by SIGUSR1 (its default action), so it is never sent one:
    a `directory` job saves on the SIGTERM that a stop or a spot warning brings, a `none` job
    has nothing to save (docs/job-spec.md, "Any training script")."""
    if not job.require_spec().checkpoint.takes_checkpoint_requests:
        return ()
    return (SignalCheckpoint(live_instances(attempt), attempt.container_name(job.job_id)),)


# ---- spot ---------------------------------------------------------------------------------------
def on_spot_warning(job: Job, instance_id: str, *, now: datetime, action: str = "terminate") -> Decision:
    """Checkpoint now, and launch the replacement at once in another pool; for one node of a gang
    that may regroup, only that node's replacement, into its pool (`domain.regroup`).

    With a policy stop under way the reclaim completes that stop instead: no replacement is
    launched, and `settle` ends the job STOPPED with the stop's reason once the instances are gone.
    """
    attempt = running_attempt(job, instance_id)
    if attempt is None or attempt.interrupted_at is not None:
        return ignore(Outcome.ALREADY_HANDLED, f"the attempt of {instance_id} is already interrupted, replaced or over")
    if job.require_spec().nodes > 1:
        from gpujobs.domain import regroup  # a gang's only: one node's warning loads no more

        if regroup.may_regroup(job, attempt, instance_id, now=now) is None:
            return regroup.on_node_warning(job, attempt, instance_id, now=now)
    marked = job.with_attempt(attempt.model_copy(update={"interrupted_at": now}), now=now)
    detail = f"spot {action} warning for {instance_id}"
    signals = checkpoint_signals(job, attempt)
    if job.stop_request is not None:
        detail += f"; the {job.stop_request.reason.value} stop under way ends the job"
        return Decision(Outcome.INTERRUPTED, marked, signals, detail, {"SpotInterruptions": 1})
    for target, reason in interruption_moves(job).steps:
        marked = marked.transition(target, reason, now=now, detail=detail, interruptions=job.interruptions + 1)
    effects: tuple[Effect, ...] = signals
    if marked.state is JobState.INTERRUPTED:
        effects += (Launch(job.job_id),)
    return Decision(Outcome.INTERRUPTED, marked, effects, detail, {"SpotInterruptions": 1})


def on_rebalance(job: Job, instance_id: str, *, now: datetime) -> Decision:
    """A proactive checkpoint; no relaunch unless a warning follows. A job that takes no
    checkpoint requests ignores the notice: the spot warning, if one comes, is what it acts on."""
    attempt = running_attempt(job, instance_id)
    if attempt is None:
        return ignore(Outcome.SIGNALLED_RECENTLY)
    signals = checkpoint_signals(job, attempt)
    if not signals:
        return ignore(Outcome.NO_CHECKPOINT_REQUESTS, f"checkpoint mode {job.require_spec().checkpoint.value}")
    last = attempt.checkpoint_signalled_at
    if last is not None and now - last < REBALANCE_SIGNAL_INTERVAL:
        return ignore(Outcome.SIGNALLED_RECENTLY)
    noted = job.with_attempt(attempt.model_copy(update={"checkpoint_signalled_at": now}), now=now)
    return Decision(Outcome.CHECKPOINT_REQUESTED, noted, signals, metrics={"RebalanceCheckpoints": 1})


# ---- reports from the training container --------------------------------------------------------
def on_report(job: Job, report: Report, *, now: datetime) -> Decision:
    """A proven report from an attempt's instance, as the report type it was parsed into."""
    match report:
        case CheckpointReport():
            return on_checkpoint(job, report, now=now)
        case HeartbeatReport():
            return on_heartbeat(job, report, now=now)
        case ExitReport():
            return on_exit(job, report, now=now)


def on_checkpoint(job: Job, report: CheckpointReport, *, now: datetime) -> Decision:
    """Moves the newest checkpoint forward only; may complete a pending policy stop."""
    step, uri = report.step, report.uri
    changed = job
    record = job.attempt(report.attempt)
    if record is not None and (record.checkpoint_step is None or step > record.checkpoint_step):
        changed = changed.with_attempt(
            record.model_copy(update={"checkpoint_step": step, "checkpoint_at": now}), now=now
        )
    if job.checkpoint_step is None or step > job.checkpoint_step:
        changed = changed.model_copy(update={"checkpoint_step": step, "checkpoint_uri": uri, "updated_at": now})
    if changed is job:
        return ignore(Outcome.NOT_NEWER, f"step {step} is not newer than {job.checkpoint_step}")
    recorded = Decision(
        Outcome.CHECKPOINT_RECORDED, changed, detail=f"checkpoint at step {step}", metrics={"CheckpointsCommitted": 1}
    )
    return recorded.then(settle(changed, now=now))


def on_heartbeat(job: Job, report: HeartbeatReport, *, now: datetime) -> Decision:
    attempt, step = report.attempt, report.step
    record = job.attempt(attempt)
    if record is None or record.is_over or (record.heartbeat_step is not None and step < record.heartbeat_step):
        return ignore(Outcome.NOT_NEWER, "stale heartbeat")
    last, interval = record.last_heartbeat_at, heartbeat_record_interval(job)
    if last is not None and now - last < interval:
        detail = f"heartbeat at step {step} within {interval.total_seconds():g}s of the one recorded"
        return Decision(Outcome.RATE_LIMITED, detail=detail, metrics={RATE_LIMITED_METRIC: 1})
    updated = job.with_attempt(record.model_copy(update={"last_heartbeat_at": now, "heartbeat_step": step}), now=now)
    if report.metrics is not None:  # a trainer older than metrics signs neither them nor its rate
        point = ProgressPoint(
            at=now,
            attempt=attempt,
            step=step,
            metrics=dict(report.metrics),
            steps_per_second=report.steps_per_second,
            samples_per_second=report.samples_per_second,
        )
        updated = updated.model_copy(update={"progress": updated.progress.with_point(point)})
    metrics = _resume_metrics(updated, attempt) if record.last_heartbeat_at is None else {}
    return Decision(Outcome.HEARTBEAT_RECORDED, updated, detail=f"heartbeat at step {step}", metrics=metrics)


def heartbeat_record_interval(job: Job) -> timedelta:
    """How often one attempt's heartbeats may cost a write: any instance can put events on the bus,
    so a flood of (proven) heartbeats from one attempt is bounded to one write per interval; the
    rest are acknowledged unwritten. A trainer at its own period is never limited (the interval
    is at most that period), and the hang limits span several periods (`trainer_settings`)."""
    return min(HEARTBEAT_RECORD_INTERVAL, timedelta(seconds=job.require_spec().trainer.heartbeat_seconds))


def _resume_metrics(job: Job, attempt_number: int) -> dict[str, float]:
    """On a replacement's first heartbeat: seconds from the warning and steps lost to it."""
    current = job.attempt(attempt_number)
    previous = next((a for a in reversed(job.attempts) if a.number < attempt_number and a.instance_ids), None)
    if current is None or previous is None or previous.interrupted_at is None or current.last_heartbeat_at is None:
        return {}
    metrics = {"SecondsWarningToResumed": (current.last_heartbeat_at - previous.interrupted_at).total_seconds()}
    if previous.heartbeat_step is not None and job.checkpoint_step is not None:
        # The replacement resumes from the newest committed checkpoint, whatever was known at launch.
        metrics["StepsLostToInterruption"] = float(max(0, previous.heartbeat_step - job.checkpoint_step))
    return metrics


def on_exit(job: Job, report: ExitReport, *, now: datetime) -> Decision:
    """Record a node's exit code, then judge the attempt.

    A report may overtake the write that records the launch: it is kept on the attempt under its
    instance id (or `rank:<n>`) and mapped onto the instances when they are recorded. The message
    of the attempt's first failed exit is kept as its `error_line` (shown, never decided on).
    """
    exit_code, message = report.exit_code, report.message
    found = job.attempt(report.attempt)
    key = None if found is None or found.is_over else exit_key(found, report.instance_id, report.node_rank)
    if found is None or key is None or key in found.exit_codes:
        return ignore(Outcome.ALREADY_HANDLED, "exit already recorded, or the attempt is over")
    update: dict[str, object] = {"exit_codes": {**found.exit_codes, key: exit_code}}
    if exit_code != 0 and message.strip() and not found.error_line:
        update["error_line"] = cap_detail(" ".join(message.split()))
    if exit_code in HARDWARE_EXIT_CODES:  # which node, and what its check found: shown, and its pool scored down
        said = cap_detail(" ".join(message.split())) or HARDWARE_EXIT_CODES[ExitCode(exit_code)]
        update["unhealthy"] = {**found.unhealthy, key: said}
    if exit_code == ExitCode.SLOW_INTERCONNECT:  # the launcher's claim, as it said it: judged with progress (fate)
        said = cap_detail(" ".join(message.split())) or Reason.SLOW_INTERCONNECT.value
        update["slow_interconnect"] = {**found.slow_interconnect, key: said}
    changed = job.with_attempt(found.model_copy(update=update), now=now)
    return Decision(Outcome.EXIT_RECORDED, changed, detail=f"exit {exit_code} on {key}").then(settle(changed, now=now))


def exit_key(attempt: Attempt, instance_id: str | None, node_rank: int | None) -> str | None:
    if not attempt.instance_ids:  # the launch is not recorded yet
        if instance_id is not None:
            return instance_id
        return f"rank:{node_rank}" if node_rank is not None and node_rank >= 0 else None
    if instance_id is None and node_rank is not None and 0 <= node_rank < len(attempt.instance_ids):
        instance_id = attempt.instance_ids[node_rank]
    return instance_id if instance_id in attempt.instance_ids else None


# ---- instances ----------------------------------------------------------------------------------
def on_gone(
    job: Job, instance_ids: tuple[str, ...], *, now: datetime, reasons: Mapping[str, str] | None = None
) -> Decision:
    """Instances seen stopping, stopped or terminated, recorded on their attempts (with EC2's state
    reason, when the caller read one: what a death at boot says of its cause)."""
    changed = job
    for iid in instance_ids:
        attempt = changed.attempt_of_instance(iid)
        if attempt is None or attempt.is_over or iid in attempt.gone:
            continue
        said = {iid: cap_detail(reasons[iid])} if reasons and reasons.get(iid) else {}
        updated = attempt.model_copy(
            update={
                "gone": (*attempt.gone, iid),
                "first_gone_at": attempt.first_gone_at or now,
                "gone_reasons": {**attempt.gone_reasons, **said},
            }
        )
        if updated.all_gone:
            updated = updated.model_copy(update={"gone_at": now})
        changed = changed.with_attempt(updated, now=now)
    if changed is job:
        return ignore(Outcome.ALREADY_HANDLED, "already recorded gone")
    return Decision(Outcome.GONE_RECORDED, changed, detail=f"gone: {', '.join(instance_ids)}")


def on_instance_gone(
    job: Job, instance_ids: tuple[str, ...], *, now: datetime, reasons: Mapping[str, str] | None = None
) -> Decision:
    """Record the instances gone, then settle: a duplicate event may still find a verdict due."""
    gone = on_gone(job, instance_ids, now=now, reasons=reasons)
    settled = settle(gone.job or job, now=now)
    return settled if gone.job is None else gone.then(settled)


def settle(job: Job, *, now: datetime) -> Decision:
    """Judge every unfinished attempt from its record and move the job accordingly."""
    effects: list[Effect] = []
    notes: list[str] = []
    changed, relaunch = job, False
    for attempt in job.attempts:
        if attempt.is_over or not attempt.instance_ids:
            continue
        judgement = judge_attempt(changed, attempt, now=now)
        if judgement.verdict is Verdict.WAIT:
            continue
        if judgement.verdict is Verdict.TERMINATE_GANG:
            effects.append(Terminate(live_instances(attempt)))
            notes.append(f"gang of attempt {attempt.number} terminated after a crash ({judgement.detail})")
            continue
        update: dict[str, object] = {"ended_at": now, "end_reason": judgement.verdict.value}
        if judgement.verdict is Verdict.INTERRUPTED and attempt.interrupted_at is None:
            update["interrupted_at"] = now  # reclaimed without a warning: the replacement avoids its pool
        if attempt.waits_for_replacement and attempt.regroup and attempt.interrupted_at is None:
            update["interrupted_at"] = attempt.regroup.at  # it ends while being reclaimed: as of the warning
        ended = attempt.whole_again().model_copy(update=update)
        changed = changed.with_attempt(ended, now=now)
        effects.append(DeleteAlarms(attempt.instance_ids))
        notes.append(f"attempt {attempt.number} {judgement.verdict.value}")
        move = moves_for(changed, judgement) if job.is_current(attempt) else None
        if move is None:
            changed, kept_effects = keep_or_terminate(changed, ended, judgement.verdict, now=now)
            effects += kept_effects
            continue
        counters = {
            "interruptions": changed.interruptions + (1 if move.counts_interruption else 0),
            "crashes": changed.crashes + (1 if move.counts_crash else 0),
        }
        for target, reason in move.steps:
            released = {"admission": None, "stop_request": None} if reason is Reason.PREEMPTED else {}
            changed = changed.transition(target, reason, now=now, detail=judgement.detail, **counters, **released)
        relaunch = relaunch or move.relaunch
        changed, kept_effects = keep_or_terminate(changed, ended, judgement.verdict, now=now)
        effects += kept_effects
    changed, stop_effects, stop_note = _carry_out_stop(changed, now)
    effects += stop_effects
    notes += [stop_note] if stop_note else []
    settled_anything = changed is not job or bool(effects)
    changed, resent = _resend_stop_checkpoint(changed, now)
    effects += resent
    record = None if changed is job else changed
    if record is None and not effects:
        return ignore(Outcome.NOTHING_TO_DECIDE)
    if relaunch or changed.state in (JobState.QUEUED, JobState.INTERRUPTED):
        effects.append(Launch(job.job_id))
    notes += ["checkpoint-now sent again: no commit newer than the stop's request yet"] if resent else []
    outcome = Outcome.SETTLED if settled_anything else Outcome.CHECKPOINT_RESENT
    return Decision(outcome, record, tuple(effects), "; ".join(notes), _settle_metrics(job, changed))


def _carry_out_stop(job: Job, now: datetime) -> tuple[Job, tuple[Effect, ...], str]:
    """A due policy stop takes the current attempt's live instances, again on every settle until
    they are recorded gone; `executed_at` only records when it was first carried out."""
    request, attempt = job.stop_request, job.current_attempt
    if request is None or attempt is None or attempt.is_over or not stop_is_due(job, now=now):
        return job, (), ""
    live = live_instances(attempt)
    if not live:
        return job, (), ""
    if request.executed_at is None:
        executed = request.model_copy(update={"executed_at": now})
        job = job.model_copy(update={"stop_request": executed, "updated_at": now})
    if attempt.market is Market.ON_DEMAND and request.reason is not Reason.PREEMPTED:  # a preempted job relaunches
        return job, (Stop(live),), f"stopping {len(live)} on-demand instance(s) for {request.reason.value}"
    return job, (Terminate(live),), f"terminating {len(live)} spot instance(s) for {request.reason.value}"


def _resend_stop_checkpoint(job: Job, now: datetime) -> tuple[Job, tuple[Effect, ...]]:
    """The checkpoint-now of a stop still waiting for its commit, again, if the last was sent
    `CHECKPOINT_RESEND_INTERVAL` ago or more (or never recorded); the time is written with it."""
    request, attempt = job.stop_request, job.current_attempt
    if request is None or request.executed_at is not None or job.state is not JobState.RUNNING:
        return job, ()
    if attempt is None or attempt.is_over or stop_is_due(job, now=now):
        return job, ()
    last = attempt.checkpoint_signalled_at
    if last is not None and now - last < CHECKPOINT_RESEND_INTERVAL:
        return job, ()
    signals = checkpoint_signals(job, attempt)
    if not signals or not live_instances(attempt):
        return job, ()
    return job.with_attempt(attempt.model_copy(update={"checkpoint_signalled_at": now}), now=now), signals


def _settle_metrics(before: Job, after: Job) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if after.interruptions > before.interruptions:
        metrics["SpotInterruptions"] = float(after.interruptions - before.interruptions)
    if after.crashes > before.crashes:
        metrics["AttemptsCrashed"] = float(after.crashes - before.crashes)
    if after.state is not before.state and after.state.is_terminal:
        metrics[f"Jobs{after.state.value.title()}"] = 1.0
    return metrics


# ---- policy stops -------------------------------------------------------------------------------
def request_stop(job: Job, reason: Reason, *, detail: str, now: datetime) -> Decision:
    """Checkpoint first; the instances go when that checkpoint is committed (or at the deadline).

    A job that takes no checkpoint requests has none to wait for: its stop is due at once
    (`fate.stop_is_due`), and stopping its instances sends the SIGTERM a `directory` job saves on."""
    if job.state is not JobState.RUNNING or job.stop_request is not None:
        return ignore(Outcome.NOT_RUNNING)
    request = StopRequest(
        reason=reason,
        requested_at=now,
        deadline=now + (PREEMPTION_GRACE if reason is Reason.PREEMPTED else STOP_CHECKPOINT_DEADLINE),
        checkpoint_step_at_request=job.checkpoint_step,
        detail=detail,
    )
    asked = job.model_copy(update={"stop_request": request, "updated_at": now, "status_detail": detail})
    attempt = job.current_attempt
    effects = checkpoint_signals(job, attempt) if attempt is not None else ()
    if effects and attempt is not None:  # when it was sent: a settle sends it again if no commit follows
        asked = asked.with_attempt(attempt.model_copy(update={"checkpoint_signalled_at": now}), now=now)
    metric = STOP_METRIC.get(reason, "PolicyStops")
    how = "checkpoint first" if effects else "SIGTERM now"
    stop = Decision(Outcome.STOP_REQUESTED, asked, effects, f"stop requested ({reason.value}): {how}", {metric: 1})
    return stop if effects else stop.then(settle(asked, now=now))


def on_idle_alarm(job: Job, instance_id: str, *, now: datetime) -> Decision:
    if running_attempt(job, instance_id) is None:
        return Decision(Outcome.ALARM_OF_ENDED_ATTEMPT, effects=(DeleteAlarms((instance_id,)),))
    idle = job.require_spec().idle
    detail = f"GPU utilization below {idle.gpu_util_below_percent:g}% for {idle.for_minutes} min on {instance_id}"
    if idle.action is IdleAction.IGNORE:
        noted = job.model_copy(update={"status_detail": f"{detail} (idle action: ignore)", "updated_at": now})
        return Decision(Outcome.IDLE_RECORDED, noted, detail=detail, metrics={"IdleIgnored": 1})
    return request_stop(job, Reason.IDLE, detail=detail, now=now)
