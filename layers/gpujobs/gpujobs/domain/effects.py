"""What a decision asks the world to do, as data: the typed effects, the outcome, the decision.

Deciding and acting are separate steps. A decision function reads the job record, the time and
the observation, and returns a `Decision`: the record to write (or None when nothing changes),
the effects to carry out once that write has succeeded, and an `Outcome` the handlers log and
count. Effects are re-derived from the record on every decision (level-triggered), so one that
fails is issued again by the next event or the reconciler's next tick, never lost because the
record already says "done". Every effect here is idempotent on the cloud's side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpujobs.domain.job import Attempt, Job


@dataclass(frozen=True)
class Terminate:
    instance_ids: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    """On-demand only: a spot instance launched by gpujobs cannot be stopped."""

    instance_ids: tuple[str, ...]


@dataclass(frozen=True)
class TerminateJobInstances:
    """Every instance EC2 still holds for the job, whether the record knows it or not (cancel)."""

    job_id: str


@dataclass(frozen=True)
class CreateAlarms:
    job_id: str
    instance_ids: tuple[str, ...]
    below_percent: float
    minutes: int


@dataclass(frozen=True)
class DeleteAlarms:
    instance_ids: tuple[str, ...]


@dataclass(frozen=True)
class SignalCheckpoint:
    instance_ids: tuple[str, ...]
    container: str


@dataclass(frozen=True)
class DumpStacks:
    """Ask a hung gang's containers for every rank's stacks (SIGUSR2; `domain.hangs`)."""

    instance_ids: tuple[str, ...]
    container: str


@dataclass(frozen=True)
class TagGeneration:
    """Tag a regrouping gang's nodes with its generation (`domain.regroup`): a survivor whose
    workload exited 75 rendezvous again with the nodes of its new generation."""

    instance_ids: tuple[str, ...]
    generation: int


@dataclass(frozen=True)
class Launch:
    """Start (or take over) the launch the job is due; carried out after every other effect."""

    job_id: str


Effect = (
    Terminate
    | Stop
    | TerminateJobInstances
    | CreateAlarms
    | DeleteAlarms
    | SignalCheckpoint
    | DumpStacks
    | TagGeneration
    | Launch
)

EFFECTS_FAILED = "EffectsFailed"
"""The metric a failed effect is counted in (dimension `Effect`: the AWS call that failed)."""


def aws_call_of(effect: Effect) -> str | None:
    """The AWS call an effect stands for: the `Effect` dimension of `EFFECTS_FAILED` (EffectsFailedAlarm
    sums one series per name). None for a launch, which the launcher carries out and records itself."""
    match effect:
        case Terminate() | TerminateJobInstances():
            return "Terminate"
        case Stop():
            return "Stop"
        case CreateAlarms():
            return "PutMetricAlarm"
        case DeleteAlarms():
            return "DeleteAlarms"
        case SignalCheckpoint() | DumpStacks():
            return "SendCommand"
        case TagGeneration():
            return "CreateTags"
        case Launch():
            return None


class Outcome(StrEnum):
    """What a decision did, for logs and metrics. The `IGNORED` ones wrote nothing to the record
    (a few still act: an alarm of an ended attempt is deleted, a cancel of an ended job terminates
    what it still holds)."""

    INTERRUPTED = "interrupted"
    CHECKPOINT_REQUESTED = "checkpoint requested"
    CHECKPOINT_RESENT = "a pending stop's checkpoint-now sent again"
    CHECKPOINT_RECORDED = "checkpoint recorded"
    HEARTBEAT_RECORDED = "heartbeat recorded"
    EXIT_RECORDED = "exit recorded"
    GONE_RECORDED = "instances gone recorded"
    SETTLED = "settled"
    NOTHING_TO_DECIDE = "nothing to decide yet"
    STOP_REQUESTED = "stop requested"
    IDLE_RECORDED = "idle recorded (action ignore)"
    IDLE_DETECTION_OFF = "idle detection off: no GPU metric (noted)"
    LAUNCH_CLAIMED = "launch claimed"
    LAUNCH_HELD = "held by the budget"
    ADMITTED = "admitted: its team's GPUs fit"
    ADMISSION_WAITS = "waits for admission"
    PREEMPTED = "preempted: waits its turn again"
    ENROLLED = "counted in the GPU ledger"
    LEDGER_SETTLED = "counted again: an older release's write changed it"
    LAUNCHED = "instances launched"
    LAUNCH_ENDED = "launch ended"
    LAUNCH_PAUSED = "launch paused at the invocation's deadline"
    LAUNCH_ABANDONED = "launch abandoned: the job moved on"
    CANCELLED = "cancelled"
    KEEP_RELEASED = "the failed gang kept for inspection released"
    BUDGET_APPLIED = "budget policy applied"
    MARKET_CHANGED = "moved to the market the deadline needs"
    OBJECTS_DELETED = "the ended job's objects deleted"
    HANG_DUMP_ASKED = "hung: its ranks' stacks asked for before the kill"
    HUNG_GANG_TERMINATED = "hung: its gang terminated"
    # ---- ignored ----
    NOT_OURS = "ignored: not a gpujobs instance"
    UNKNOWN_JOB = "ignored: no such job"
    UNKNOWN_REPORT = "ignored: unknown report"
    NOT_AN_END = "ignored: the state changes nothing"
    ALREADY_HANDLED = "ignored: already recorded, replaced or over"
    SIGNALLED_RECENTLY = "ignored: no running attempt, or signalled moments ago"
    NO_CHECKPOINT_REQUESTS = "ignored: the job's checkpoint mode takes no checkpoint-now"
    NOT_NEWER = "ignored: not newer than what is recorded"
    RATE_LIMITED = "ignored: a heartbeat of the attempt was recorded moments ago"
    NOT_RUNNING = "ignored: not running, or a stop is already under way"
    ALARM_OF_ENDED_ATTEMPT = "ignored: the alarm's attempt is over (alarm deleted)"
    ALARM_NOT_ACTIONABLE = "ignored: the alarm is not in ALARM or names no instance"
    NOT_DUE = "ignored: no launch is due"
    NOT_ADMITTED = "ignored: it waits for admission"
    NOT_A_BUDGET_ALERT = "ignored: not a budget notification we understand"
    NOT_THIS_STACK = "ignored: not one of this stack's budgets"
    BELOW_THRESHOLD = "ignored: anomaly below the threshold"
    UNPROVEN_REPORT = "ignored: the report's proof is missing, wrong or stale"
    MALFORMED = "ignored: malformed event or id"
    OTHER_STACK = "ignored: another stack's resource"
    NOT_HUNG = "ignored: not hung"
    HANG_DUMP_AWAITED = "ignored: hung, its dump is awaited before the kill"

    @property
    def ignored(self) -> bool:
        return self in IGNORED


IGNORED = frozenset(
    {
        Outcome.NOT_OURS,
        Outcome.UNKNOWN_JOB,
        Outcome.UNKNOWN_REPORT,
        Outcome.NOT_AN_END,
        Outcome.ALREADY_HANDLED,
        Outcome.SIGNALLED_RECENTLY,
        Outcome.NO_CHECKPOINT_REQUESTS,
        Outcome.NOT_NEWER,
        Outcome.RATE_LIMITED,
        Outcome.NOT_RUNNING,
        Outcome.ALARM_OF_ENDED_ATTEMPT,
        Outcome.ALARM_NOT_ACTIONABLE,
        Outcome.NOT_DUE,
        Outcome.NOT_ADMITTED,
        Outcome.NOT_A_BUDGET_ALERT,
        Outcome.NOT_THIS_STACK,
        Outcome.BELOW_THRESHOLD,
        Outcome.UNPROVEN_REPORT,
        Outcome.MALFORMED,
        Outcome.OTHER_STACK,
        Outcome.NOT_HUNG,
        Outcome.HANG_DUMP_AWAITED,
    }
)


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    job: Job | None = None
    """The record to write, conditional on the version it was decided from; None: write nothing."""
    effects: tuple[Effect, ...] = ()
    """Carried out in order once the write has succeeded (or at once when there is none)."""
    detail: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)

    def then(self, later: Decision) -> Decision:
        """This decision followed by one taken on its record: one write, the effects of both."""
        return Decision(
            outcome=self.outcome,
            job=later.job or self.job,
            effects=self.effects + later.effects,
            detail="; ".join(d for d in (self.detail, later.detail) if d),
            metrics={**self.metrics, **later.metrics},
        )


def ignore(outcome: Outcome, detail: str = "") -> Decision:
    return Decision(outcome, detail=detail)


def live_instances(attempt: Attempt) -> tuple[str, ...]:
    """The attempt's instances not yet seen stopping, stopped or gone."""
    return tuple(i for i in attempt.instance_ids if i not in attempt.gone)
