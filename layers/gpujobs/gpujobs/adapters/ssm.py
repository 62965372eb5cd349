"""Signals to a job's containers through SSM Run Command, using the stack's own command document:
'checkpoint now' (SIGUSR1) and 'dump your stacks' (SIGUSR2, a hung gang before its kill).

The document (`CheckpointNowDocument` in template.yaml) takes the container name and the signal as
parameters whose allowedPatterns only admit gpujobs container names and SIGUSR1 or SIGUSR2, and
runs `docker kill --signal <signal> <container>`: no shell text is ever built from a string here. SendCommand takes at most 50 instance ids,
so a larger gang (up to 64 nodes) is signalled in chunks of 50.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types_boto3_ssm import SSMClient

MAX_INSTANCE_IDS_PER_COMMAND = 50
"""SendCommand's `InstanceIds` limit (moto does not enforce it; AWS answers ValidationException)."""


class SsmSignaller:
    def __init__(self, *, client: SSMClient, document_name: str) -> None:
        self._ssm = client
        self._document = document_name

    def checkpoint_now(self, *, instance_ids: Sequence[str], container: str) -> None:
        self._send(instance_ids, container, signal="SIGUSR1", what="checkpoint now")

    def dump_stacks(self, *, instance_ids: Sequence[str], container: str) -> None:
        self._send(instance_ids, container, signal="SIGUSR2", what="dump stacks")

    def _send(self, instance_ids: Sequence[str], container: str, *, signal: str, what: str) -> None:
        ids = list(instance_ids)
        for start in range(0, len(ids), MAX_INSTANCE_IDS_PER_COMMAND):
            self._ssm.send_command(
                InstanceIds=ids[start : start + MAX_INSTANCE_IDS_PER_COMMAND],
                DocumentName=self._document,
                Parameters={"containerName": [container], "signal": [signal]},
                TimeoutSeconds=60,
                Comment=f"gpujobs {what}: {container}"[:100],
            )
