"""Progress reports to the stack's EventBridge bus (source ``gpujobs.trainer``).

Reporting is advisory: the control plane reconciles from S3 and EC2 anyway. So publishing
happens on a background thread and every failure is logged, never raised into training. Every
report is signed with the attempt's report key (``signing``), or the control plane ignores it.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from gpujobs_trainer.signing import key_from_env, signed

log = logging.getLogger("gpujobs_trainer")

SOURCE = "gpujobs.trainer"
CHECKPOINT_COMMITTED = "Checkpoint Committed"
TRAINING_HEARTBEAT = "Training Heartbeat"
JOB_EXITED = "Job Exited"


class Publisher(Protocol):
    def publish(self, detail_type: str, detail: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class NullPublisher:
    """Reporting disabled (no GPUJOBS_EVENT_BUS)."""

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        """Drop the event."""

    def close(self) -> None:
        """Nothing to flush."""


class EventBridgePublisher:
    """PutEvents on one bus, one background thread, failures logged; each report signed with ``key``
    (by default the attempt's key the bootstrap put in the environment)."""

    def __init__(self, bus: str, *, client: Any = None, key: bytes | None = None) -> None:
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.client("events", config=Config(retries={"max_attempts": 3}, connect_timeout=3))
        self.bus = bus
        self._client = client
        self._key = key_from_env() if key is None else key
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpujobs-events")

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        self._executor.submit(self._send, detail_type, detail)

    def publish_now(self, detail_type: str, detail: dict[str, Any]) -> bool:
        """Synchronous variant for the launcher's last words; True when accepted."""
        return self._send(detail_type, detail)

    def _send(self, detail_type: str, detail: dict[str, Any]) -> bool:
        try:
            response = self._client.put_events(
                Entries=[
                    {
                        "Source": SOURCE,
                        "DetailType": detail_type,
                        "Detail": json.dumps(signed(self._key, detail_type, detail)),
                        "EventBusName": self.bus,
                    }
                ]
            )
            if response.get("FailedEntryCount", 0):
                log.warning("event %r rejected: %s", detail_type, response.get("Entries"))
                return False
            return True
        except Exception as exc:
            log.warning("publishing event %r failed: %s", detail_type, exc)
            return False

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def make_publisher(bus: str) -> Publisher:
    if not bus:
        log.info("GPUJOBS_EVENT_BUS not set: event reporting disabled")
        return NullPublisher()
    return EventBridgePublisher(bus)
