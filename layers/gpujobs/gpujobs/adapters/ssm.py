"""'Checkpoint now' through SSM Run Command, using the stack's own command document.

The document (`CheckpointNowDocument` in template.yaml) takes the container name as a parameter
whose allowedPattern only admits gpujobs container names, and runs `docker kill --signal SIGUSR1`
on it: no shell text is ever built from a string here. SendCommand takes at most 50 instance ids,
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
        ids = list(instance_ids)
        for start in range(0, len(ids), MAX_INSTANCE_IDS_PER_COMMAND):
            self._ssm.send_command(
                InstanceIds=ids[start : start + MAX_INSTANCE_IDS_PER_COMMAND],
                DocumentName=self._document,
                Parameters={"containerName": [container]},
                TimeoutSeconds=60,
                Comment=f"gpujobs checkpoint now: {container}"[:100],
            )
