"""Workers stuck in their teardown after they reported their outcome.

A worker on the trainer library writes its outcome in ``finish()`` (after its final or preemption
checkpoint is committed) or when it stops on a configuration error; then it only tears down. torch
can hang there: a gloo worker thread that still holds a finished collective's tensors needs the GIL
to free them while the main thread, holding it, joins that thread in the process group's
destructor (seen with DDP's Reducer freeing the group). At interpreter exit the same race aborts
the process instead ("terminate called without an active exception"), which `outcome.decide_exit`
forgives. A hang it cannot: torchrun would wait for ever and the attempt would end only by the
control plane's hang timeout, its result lost.

So once every local worker has reported, the launcher gives the workers ``grace`` seconds to exit
and then kills the ones still there (SIGKILL: a Python SIGTERM handler never runs in a thread stuck
in C++). Nothing is lost: each of them said what it did, and the launcher decides from that.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpujobs_trainer.outcome import read_outcomes
from gpujobs_trainer.workers import child_pids

log = logging.getLogger("gpujobs_trainer.teardown")

GRACE_ENV = "GPUJOBS_TEARDOWN_GRACE_SECONDS"
DEFAULT_GRACE_SECONDS = 60
"""The launcher's default grace (`launch.LaunchPlan.teardown_grace`); a bad value is a ConfigError there."""


class TeardownWatch:
    """Ticked by the launcher while torchrun runs; ends workers that outlive their reports."""

    def __init__(
        self,
        outcome_dir: Path,
        *,
        expected_workers: int,
        torchrun_pid: int,
        grace: float,
        clock: Callable[[], float] = time.monotonic,
        workers: Callable[[int], list[int]] = child_pids,
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        self.outcome_dir = outcome_dir
        self.expected_workers = expected_workers
        self.torchrun_pid = torchrun_pid
        self.grace = grace
        self.clock = clock
        self.workers = workers
        self.kill = kill
        self.reported_at: float | None = None
        self.killed: list[int] = []

    def tick(self) -> None:
        if self.killed:
            return
        if self.reported_at is None:
            if len(read_outcomes(self.outcome_dir)) >= self.expected_workers:
                self.reported_at = self.clock()
            return
        waited = self.clock() - self.reported_at
        if waited < self.grace:
            return
        stuck = self.workers(self.torchrun_pid)
        if not stuck:
            return
        log.warning(
            "every worker reported its outcome %.0f s ago, but workers %s have not exited: stuck in their "
            "teardown (torch's process group can hang at exit); ending them, their outcomes stand",
            waited,
            stuck,
        )
        for pid in stuck:
            with contextlib.suppress(ProcessLookupError):
                self.kill(pid, signal.SIGKILL)
        self.killed = stuck


def exit_code_within(proc: subprocess.Popen[bytes], *, seconds: float) -> int | None:
    """``proc``'s exit code if it exits within ``seconds``, else None."""
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None
