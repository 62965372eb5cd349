"""How the bootstrap fails. Both errors end the bootstrap with a "bootstrap-failed" exit report."""

from __future__ import annotations


class BootstrapError(Exception):
    """The instance cannot run the job; reported with exit code 125 and this message."""


class StoppedError(Exception):
    """SIGTERM/SIGINT before the workload started: give up at once (pull, rendezvous, ...)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum} before the workload started")
        self.signum = signum
