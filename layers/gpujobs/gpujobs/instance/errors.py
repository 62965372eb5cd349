"""How the bootstrap fails. The first two end it with a "bootstrap-failed" exit report, the last with
an "unhealthy-node" one (`gpu_health.py`)."""

from __future__ import annotations


class BootstrapError(Exception):
    """The instance cannot run the job; reported with exit code 125 and this message."""


class StoppedError(Exception):
    """SIGTERM/SIGINT before the workload started: give up at once (pull, rendezvous, ...)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum} before the workload started")
        self.signum = signum


class UnhealthyNodeError(Exception):
    """This node's GPU check failed before the workload started: reported with exit code 122 and what it found."""
