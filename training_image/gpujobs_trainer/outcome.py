"""How workers tell the launcher what happened, and the launcher's one exit code.

torchrun exits 1 after a SIGTERM even when every worker saved and exited cleanly, and 1 when a
worker exits 75 on its own. So the launcher decides from small outcome files that each worker
writes into GPUJOBS_OUTCOME_DIR just before exiting; a worker that wrote nothing crashed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gpujobs_trainer.errors import (
    CONFIG_ERROR_EXIT_CODE,
    CRASH_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    SUCCESS_EXIT_CODE,
)


@dataclass(frozen=True, kw_only=True)
class WorkerOutcome:
    rank: int
    exit_code: int
    reason: str  # succeeded | preempted | config-error | failed
    step: int | None = None
    message: str = ""


def write_outcome(outcome_dir: str, outcome: WorkerOutcome) -> None:
    if not outcome_dir:
        return
    folder = Path(outcome_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".outcome-rank-{outcome.rank:05d}.tmp"
    tmp.write_text(json.dumps(outcome.__dict__), encoding="utf-8")
    tmp.replace(folder / f"outcome-rank-{outcome.rank:05d}.json")


def read_outcomes(outcome_dir: Path) -> list[WorkerOutcome]:
    outcomes = []
    for path in sorted(outcome_dir.glob("outcome-rank-*.json")):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            outcomes.append(WorkerOutcome(**raw))
        except (ValueError, TypeError):
            continue
    return outcomes


@dataclass(frozen=True)
class JobOutcome:
    exit_code: int
    reason: str  # succeeded | preempted | config-error | crashed
    message: str = ""
    """A configuration error's words (the first worker's that reported one): the exit report's message."""
    note: str = ""
    """Why the exit code is not torchrun's, for the launcher's log."""

    def described(self) -> str:
        """The launcher's log words: ``job outcome: succeeded (exit 0)``, and the note when there is one."""
        return f"job outcome: {self.reason} (exit {self.exit_code})" + (f"; {self.note}" if self.note else "")


def decide_exit(*, torchrun_code: int, outcomes: list[WorkerOutcome], expected_workers: int) -> JobOutcome:
    """The launcher's single exit code.

    0 when torchrun succeeded, or when every local worker reported success: a worker reports it
    in ``finish()`` once its final checkpoint is committed, so a worker that dies after that, in
    the process group's or the interpreter's teardown (torch's C++ threads can abort a process at
    exit: "terminate called without an active exception", SIGABRT), lost nothing and the job is
    done; 75 only when every local worker reported a committed preemption checkpoint (torchrun's
    own code is then meaningless); 78 when a worker reported a configuration problem; anything
    else is a crash (1).
    """
    codes = [o.exit_code for o in outcomes]
    if torchrun_code == SUCCESS_EXIT_CODE and all(c == SUCCESS_EXIT_CODE for c in codes):
        return JobOutcome(SUCCESS_EXIT_CODE, "succeeded")
    if len(outcomes) >= expected_workers and all(c == SUCCESS_EXIT_CODE for c in codes):
        note = "every worker reported success (final checkpoint committed) before a worker died in its teardown"
        return JobOutcome(SUCCESS_EXIT_CODE, "succeeded", note=note)
    if len(outcomes) >= expected_workers and all(c == PREEMPTED_EXIT_CODE for c in codes):
        return JobOutcome(PREEMPTED_EXIT_CODE, "preempted")
    misconfigured = [o for o in outcomes if o.exit_code == CONFIG_ERROR_EXIT_CODE]
    if misconfigured:
        return JobOutcome(CONFIG_ERROR_EXIT_CODE, "config-error", misconfigured[0].message)
    return JobOutcome(CRASH_EXIT_CODE, "crashed")
