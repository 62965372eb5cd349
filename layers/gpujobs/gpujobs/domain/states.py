"""The one state machine for jobs: states, the allowed transitions and the reason for each.

`docs/state-machine.md` is generated from this module (`python -m gpujobs.domain.states`) and a
test keeps the two equal. A transition is identified by (from, to, reason): the reason is part of
the contract, because the control plane and its users act on *why* a job moved, not only where.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class JobState(StrEnum):
    """Every state a job can be in; `STATE_MEANINGS` documents each one."""

    QUEUED = "QUEUED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    INTERRUPTED = "INTERRUPTED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    STOPPED = "STOPPED"
    REJECTED = "REJECTED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def is_active(self) -> bool:
        """Holds or may soon hold instances: the states the reconciler watches."""
        return not self.is_terminal


TERMINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED, JobState.REJECTED}
)
ACTIVE_STATES = tuple(s for s in JobState if s not in TERMINAL_STATES)
MAX_ACTIVE_JOBS = 20_000
"""Jobs one listing of an active state returns (the reconciler's tick, a budget hold's stops): twice
the 10,000 running that the tick is measured at (bench/)."""


class Reason(StrEnum):
    """Why a job changed state. Each value appears in the transition table below."""

    SUBMITTED = "submitted"
    INVALID_SPEC = "invalid-spec"
    LAUNCH_STARTED = "launch-started"
    INSTANCES_LAUNCHED = "instances-launched"
    NO_CAPACITY = "no-capacity"
    QUOTA_EXCEEDED = "quota-exceeded"
    BUDGET_HOLD = "budget-hold"
    LAUNCH_FAILED = "launch-failed"
    SPOT_INTERRUPTION = "spot-interruption"
    DEADLINE_MARKET = "deadline-market"
    BACK_TO_SPOT = "back-to-spot"
    REPLACEMENT_LAUNCHING = "replacement-launching"
    COMPLETED = "completed"
    CRASHED_RETRYING = "crashed-retrying"
    CRASHED_TOO_OFTEN = "crashed-too-often"
    SYNC_FAILED = "sync-failed"
    CONFIG_ERROR = "config-error"
    INSTANCE_LOST = "instance-lost"
    DIED_AT_BOOT = "died-at-boot"
    INTERRUPTED_TOO_OFTEN = "interrupted-too-often"
    USER_CANCELLED = "user-cancelled"
    IDLE = "idle"
    BUDGET_EXCEEDED = "budget-exceeded"
    MAX_RUNTIME = "max-runtime"
    MAX_COST = "max-cost"
    ADMISSION_WAIT = "admission-wait"
    ADMITTED = "admitted"
    PREEMPTED = "preempted"
    NODE_RECLAIMED = "node-reclaimed"
    NODE_REPLACED = "node-replaced"
    NO_ROOM_FOR_NODE = "no-room-for-node"
    UNHEALTHY_NODE = "unhealthy-node"
    HARDWARE_FAULT = "hardware-fault"
    SLOW_INTERCONNECT = "slow-interconnect"


@dataclass(frozen=True)
class Transition:
    source: JobState | None
    """None for the creating transition."""
    target: JobState
    reason: Reason
    meaning: str


Q, L, R, INT = JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING, JobState.INTERRUPTED
_ACTIVE = (Q, L, R, INT)

TRANSITIONS: tuple[Transition, ...] = (
    Transition(None, Q, Reason.SUBMITTED, "a valid spec was recorded"),
    Transition(None, JobState.REJECTED, Reason.INVALID_SPEC, "the submission failed validation"),
    Transition(Q, L, Reason.LAUNCH_STARTED, "capacity is being requested for a new attempt"),
    Transition(Q, Q, Reason.NO_CAPACITY, "every rung of the capacity ladder failed; retry later"),
    Transition(Q, Q, Reason.QUOTA_EXCEEDED, "an EC2 vCPU quota refused the launch (its status names it); retry later"),
    Transition(
        Q, Q, Reason.BUDGET_HOLD, "a budget hold, or spot-only while the job may launch on-demand only; launches wait"
    ),
    Transition(
        Q,
        Q,
        Reason.ADMISSION_WAIT,
        "its team's GPU quota, the fleet's cap or a pause has no room for it now; it waits its turn",
    ),
    Transition(Q, Q, Reason.ADMITTED, "its turn came and its GPUs fit: they are its until it ends or is preempted"),
    Transition(
        Q, Q, Reason.PREEMPTED, "its borrowed GPUs were taken back before its gang was up; it waits its turn again"
    ),
    Transition(L, R, Reason.INSTANCES_LAUNCHED, "RunInstances returned the whole gang"),
    Transition(L, Q, Reason.NO_CAPACITY, "every rung of the capacity ladder failed; retry later"),
    Transition(L, Q, Reason.QUOTA_EXCEEDED, "an EC2 vCPU quota refused the launch (its status names it); retry later"),
    Transition(
        L, Q, Reason.BUDGET_HOLD, "a budget hold (or spot-only, for an on-demand launch) came before the launch"
    ),
    Transition(
        L, R, Reason.DEADLINE_MARKET, "a deadline's move found no room on its market: the moved attempt trains on"
    ),
    Transition(L, R, Reason.BACK_TO_SPOT, "a move back to spot found no spot room: the on-demand attempt trains on"),
    Transition(L, JobState.FAILED, Reason.LAUNCH_FAILED, "the launch failed for a reason retrying cannot fix"),
    Transition(
        R,
        Q,
        Reason.PREEMPTED,
        "its borrowed GPUs were taken back (after a checkpoint, within the spot warning's 2 min); it waits again",
    ),
    Transition(INT, Q, Reason.PREEMPTED, "preempted while being replaced; it waits its turn again"),
    Transition(R, INT, Reason.SPOT_INTERRUPTION, "a spot warning or a preempted exit; checkpoint and replace"),
    Transition(
        R,
        R,
        Reason.NODE_RECLAIMED,
        "a spot warning for one node of a gang: the gang checkpoints, the survivors stay and wait for its replacement",
    ),
    Transition(
        R, R, Reason.NODE_REPLACED, "the reclaimed node's replacement was launched into its pool: the gang regroups"
    ),
    Transition(
        R,
        INT,
        Reason.NO_ROOM_FOR_NODE,
        "the reclaimed node's pool had no room for its replacement: the whole gang is replaced instead",
    ),
    Transition(R, INT, Reason.INSTANCE_LOST, "spot instances vanished without a report; replace"),
    Transition(R, INT, Reason.DEADLINE_MARKET, "the deadline wants the other market; checkpoint and replace"),
    Transition(
        R,
        INT,
        Reason.BACK_TO_SPOT,
        "spot is calm again for an on-demand spot-first job; checkpoint and replace on spot",
    ),
    Transition(R, JobState.SUCCEEDED, Reason.COMPLETED, "every node exited 0"),
    Transition(R, Q, Reason.CRASHED_RETRYING, "the attempt crashed; attempts remain"),
    Transition(
        R, Q, Reason.SYNC_FAILED, "the script ended well but its folder's last sync failed; relaunched for the sync"
    ),
    Transition(
        R,
        JobState.FAILED,
        Reason.SYNC_FAILED,
        "the last sync of the script's folder failed and max_attempts is used up",
    ),
    Transition(R, Q, Reason.INSTANCE_LOST, "on-demand instances vanished without a report; relaunch"),
    Transition(R, JobState.FAILED, Reason.INSTANCE_LOST, "instances vanished without a report once too often"),
    Transition(R, Q, Reason.DIED_AT_BOOT, "the instances died before the bootstrap's first report; relaunch"),
    Transition(
        R, JobState.FAILED, Reason.DIED_AT_BOOT, "instances died at boot in attempts in a row: launching is broken"
    ),
    Transition(
        R,
        Q,
        Reason.UNHEALTHY_NODE,
        "a node's GPU check failed before training: its gang is relaunched elsewhere, no attempt or interruption counted",
    ),
    Transition(
        R,
        JobState.FAILED,
        Reason.UNHEALTHY_NODE,
        "nodes failed their GPU check (or hit hardware faults) in attempts in a row: the pools are broken",
    ),
    Transition(
        R,
        Q,
        Reason.HARDWARE_FAULT,
        "the workload failed with new hardware XID errors on a node: relaunched elsewhere, not counted as a crash",
    ),
    Transition(
        R,
        JobState.FAILED,
        Reason.HARDWARE_FAULT,
        "hardware faults (or failed GPU checks) in attempts in a row: the pools are broken",
    ),
    Transition(
        R,
        Q,
        Reason.SLOW_INTERCONNECT,
        "the gang's all-reduce was below its type's floor before training: relaunched elsewhere, nothing counted",
    ),
    Transition(
        R,
        JobState.FAILED,
        Reason.SLOW_INTERCONNECT,
        "slow interconnects (or failed GPU checks, hardware faults) in attempts in a row: the pools are broken",
    ),
    Transition(R, JobState.FAILED, Reason.CRASHED_TOO_OFTEN, "the attempt crashed and max_attempts is used up"),
    Transition(
        R,
        JobState.FAILED,
        Reason.CONFIG_ERROR,
        "a configuration error before the job ever made progress; a retry fails alike",
    ),
    Transition(INT, L, Reason.REPLACEMENT_LAUNCHING, "the replacement attempt is being launched"),
    Transition(INT, JobState.SUCCEEDED, Reason.COMPLETED, "the reclaimed attempt finished before any replacement"),
    Transition(INT, Q, Reason.NO_CAPACITY, "no pool had capacity for the replacement; retry later"),
    Transition(INT, Q, Reason.QUOTA_EXCEEDED, "an EC2 vCPU quota refused the replacement; retry later"),
    Transition(
        INT, Q, Reason.BUDGET_HOLD, "a budget hold (or spot-only, for an on-demand replacement): the replacement waits"
    ),
    Transition(
        INT,
        JobState.FAILED,
        Reason.INTERRUPTED_TOO_OFTEN,
        "a `spot` job past max_interruptions (a `spot-first` one never fails for them)",
    ),
    *(Transition(s, JobState.CANCELLED, Reason.USER_CANCELLED, "a user cancelled the job") for s in _ACTIVE),
    *(
        Transition(s, JobState.STOPPED, reason, meaning)
        for s in (R, INT)
        for reason, meaning in (
            (Reason.IDLE, "GPUs idle past the spec's idle policy; stopped after a checkpoint"),
            (Reason.BUDGET_EXCEEDED, "the team's budget was exceeded; stopped after a checkpoint"),
            (Reason.MAX_RUNTIME, "max_runtime_minutes reached; stopped after a checkpoint"),
            (Reason.MAX_COST, "max_cost_usd reached; stopped after a checkpoint"),
        )
    ),
)

WAITING_FOR_ROOM = frozenset({Reason.NO_CAPACITY.value, Reason.QUOTA_EXCEEDED.value})
"""An attempt's `end_reason` when its walk launched nowhere and the job waits: the capacity backoff grows over these."""

_BY_KEY = {(t.source, t.target, t.reason): t for t in TRANSITIONS}


class IllegalTransitionError(Exception):
    """The state machine does not allow this move (for this reason)."""

    def __init__(self, source: JobState | None, target: JobState, reason: Reason) -> None:
        src = source.value if source else "(new)"
        super().__init__(f"illegal transition {src} -> {target.value} ({reason.value})")
        self.source, self.target, self.reason = source, target, reason


def check_transition(source: JobState | None, target: JobState, reason: Reason) -> Transition:
    try:
        return _BY_KEY[(source, target, reason)]
    except KeyError:
        raise IllegalTransitionError(source, target, reason) from None


def can_transition(source: JobState | None, target: JobState, reason: Reason) -> bool:
    return (source, target, reason) in _BY_KEY


def render_markdown() -> str:
    """docs/state-machine.md, generated so that the document and the code cannot drift."""
    lines = [
        "# Job state machine",
        "",
        "Generated from `layers/gpujobs/gpujobs/domain/states.py` by",
        "`python -m gpujobs.domain.states > docs/state-machine.md`; a test keeps the two equal.",
        "",
        "```mermaid",
        "stateDiagram-v2",
    ]
    edges: dict[tuple[str, str], list[str]] = {}
    for t in TRANSITIONS:
        edges.setdefault((t.source.value if t.source else "[*]", t.target.value), []).append(t.reason.value)
    lines += [f"    {a} --> {b}: {', '.join(reasons)}" for (a, b), reasons in edges.items()]
    lines += [f"    {s.value} --> [*]" for s in JobState if s.is_terminal]
    lines += ["```", "", "## States", "", "| state | terminal | meaning |", "|---|---|---|"]
    for state in JobState:
        doc = (STATE_MEANINGS.get(state) or "").strip()
        lines.append(f"| `{state.value}` | {'yes' if state.is_terminal else 'no'} | {doc} |")
    lines += ["", "## Transitions", "", "| from | to | reason | meaning |", "|---|---|---|---|"]
    for t in TRANSITIONS:
        src = f"`{t.source.value}`" if t.source else "(new)"
        lines.append(f"| {src} | `{t.target.value}` | `{t.reason.value}` | {t.meaning} |")
    return "\n".join(lines) + "\n"


STATE_MEANINGS: dict[JobState, str] = {
    JobState.QUEUED: (
        "Recorded; waiting for admission (its team's GPU quota), for its launch, for capacity (with a"
        " next-try time) or for budget."
    ),
    JobState.LAUNCHING: "An attempt is being launched: RunInstances is in flight or its result not yet recorded.",
    JobState.RUNNING: "The attempt's instances exist and run the training container.",
    JobState.INTERRUPTED: "A spot interruption is under way: the old attempt checkpoints while a replacement is found.",
    JobState.SUCCEEDED: "Every node's container exited 0.",
    JobState.FAILED: (
        "Crashed more than max_attempts times, interrupted past its limit, its instances died at boot"
        " (or failed their GPU checks) attempt after attempt, or could never launch."
    ),
    JobState.CANCELLED: "Cancelled by a user; its instances were terminated.",
    JobState.STOPPED: "Stopped by policy (idle GPUs, budget, runtime or cost cap) after a safe checkpoint.",
    JobState.REJECTED: "The submission was not a valid job spec; nothing was launched.",
}

if __name__ == "__main__":
    print(render_markdown(), end="")
