"""What one reconciler run repaired: a closed set of counts, each its own metric.

The reconciler counts every repair under a `Repair`; the handler emits each count as the metric
`Repair.metric_name` (the dashboard and alarms name them), so a new repair is a new member here,
never a string made up where it is counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum


class Repair(StrEnum):
    ERRORS = "errors"
    UNREADABLE_RECORDS_SKIPPED = "unreadable records skipped"
    """Active job items this release could not read (a newer release's, after a rollback)."""
    LAUNCHES_DEFERRED_TO_THE_NEXT_RUN = "launches deferred to the next run"
    RUNNING_REPAIRS_DEFERRED_TO_THE_NEXT_RUN = "running repairs deferred to the next run"
    """Running jobs this run had no time left to repair; the least recently updated go first."""
    MARKET_MOVES = "market moves"
    REGROUPS_GIVEN_UP = "regroups whose replacement was not launched in time"
    ATTEMPTS_SETTLED = "attempts settled"
    STOP_CHECKPOINTS_RESENT = "stop checkpoints resent"
    """A policy stop's checkpoint-now sent again: no commit newer than its request yet."""
    LOST_STATE_CHANGES_REPAIRED = "lost state changes repaired"
    IDLE_ALARMS_RECREATED = "idle alarms recreated"
    IDLE_ALARMS_DELETED = "idle alarms deleted"
    IDLE_DETECTION_OFF_NOTED = "idle detection off noted"
    RECLAIMED_SURVIVORS_TERMINATED = "reclaimed survivors terminated"
    HUNG_ATTEMPTS_DUMPED = "hung attempts asked for their stacks"
    HUNG_ATTEMPTS_TERMINATED = "hung attempts terminated"
    BUDGET_HOLDS_ENFORCED = "budget holds enforced"
    RUNTIME_CAPS = "runtime caps"
    COST_CAPS = "cost caps"
    ORPHANS_SPARED_BY_A_CONSISTENT_READ = "orphans spared by a consistent read"
    ORPHANS_TERMINATED = "orphans terminated"
    PLACEMENT_GROUPS_DELETED = "placement groups deleted"
    JOB_SECURITY_GROUPS_DELETED = "job security groups deleted"
    ENDED_JOBS_OBJECTS_DELETED = "ended jobs' objects deleted"
    """Jobs whose prefix was emptied `CheckpointRetentionDays` after they ended (`domain.retention`)."""
    BUDGET_HOLDS_RELEASED = "budget holds released"
    REPLACEMENTS_LAUNCHED = "replacements launched"
    STUCK_LAUNCHES_TAKEN_OVER = "stuck launches taken over"
    QUEUED_JOBS_RETRIED = "queued jobs retried"
    JOBS_ADMITTED = "jobs admitted"
    """Waiting jobs the admission plan let start (`domain.admission`)."""
    ADMISSIONS_REFUSED = "admissions refused"
    """Admissions the ledger refused (its ceilings passed meanwhile): the plan's next run decides again."""
    PREEMPTIONS_REQUESTED = "preemptions requested"
    JOBS_ENROLLED = "jobs enrolled"
    """Active jobs of a release before the GPU ledger, counted in it now."""
    LEDGER_SETTLED = "ledger settled"
    """Jobs an older release changed (during an upgrade or a rollback) whose ledger count was set right."""

    @property
    def metric_name(self) -> str:
        """`Repairs` and the member's name in CamelCase: `ORPHANS_TERMINATED` is `RepairsOrphansTerminated`."""
        return "Repairs" + self.name.title().replace("_", "")


@dataclass
class ReconcileReport:
    active_jobs: int = 0
    live_instances: int = 0
    repairs: Counter[Repair] = field(default_factory=Counter)
    jobs_by_state: Counter[str] = field(default_factory=Counter)
    """Active jobs per state, as this run read them: the dashboard's jobs-by-state gauge."""
    team_gpus: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    """Per team, the GPUs its jobs hold (the ledger) and its quota (None: none): the dashboard's gauge."""

    def count(self, what: Repair, n: int = 1) -> None:
        self.repairs[what] += n
