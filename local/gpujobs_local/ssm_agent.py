"""The SSM agent of the local instances: runs the stack's signal command.

On EC2 the control plane's `SendCommand` (document `CheckpointNowDocument`) reaches the SSM agent,
which runs `docker kill --signal <signal> <container>`: SIGUSR1 (checkpoint now) or SIGUSR2 (a hung
gang's stacks, before its kill). Locally, moto records the command and nothing runs it; this agent
polls moto's command list and delivers the signal to the named instances' workloads through the
instance runner, so idle, budget and rebalance checkpoints and hang dumps behave as on EC2.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from gpujobs_local.instances import InstanceRunner

log = logging.getLogger(__name__)
POLL_SECONDS = 1.0
SIGNALS = {"SIGUSR1": signal.SIGUSR1, "SIGUSR2": signal.SIGUSR2}
"""The document's `signal` values (its allowedPattern); absent: its default, SIGUSR1."""


class LocalSsmAgent:
    def __init__(self, *, ssm: Any, runner: InstanceRunner, document_name: str) -> None:
        self._ssm = ssm
        self._runner = runner
        self._document = document_name
        self._done: set[str] = set()
        self._next_look = 0.0
        self.delivered: list[tuple[str, str]] = []
        """(command id, instance id) of every signal delivered."""

    def poll(self) -> None:
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + POLL_SECONDS
        for command in self._ssm.list_commands(MaxResults=50).get("Commands", []):
            command_id = command["CommandId"]
            if command_id in self._done or command.get("DocumentName") != self._document:
                continue
            self._done.add(command_id)
            name = (command.get("Parameters", {}).get("signal") or ["SIGUSR1"])[0]
            signum = SIGNALS.get(name)
            if signum is None:
                log.warning("command %s: signal %r is not one the document allows; not delivered", command_id, name)
                continue
            for instance_id in command.get("InstanceIds", []):
                if self._runner.signal_container(instance_id, signum):
                    self.delivered.append((command_id, instance_id))
                else:
                    log.info("%s for %s: no running workload", name, instance_id)
