"""Publishes `GPU Job State Change` events to the stack's custom EventBridge bus."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpujobs.contract import CONTROL_PLANE_SOURCE, JOB_STATE_CHANGE
from gpujobs.service.ports import StateChanged

if TYPE_CHECKING:
    from types_boto3_events import EventBridgeClient
    from types_boto3_events.type_defs import PutEventsRequestEntryTypeDef

SOURCE = CONTROL_PLANE_SOURCE
STATE_CHANGE = JOB_STATE_CHANGE
PUT_EVENTS_BATCH = 10


def state_change_detail(event: StateChanged) -> dict[str, Any]:
    return {
        "event_id": f"{event.job_id}:{event.sequence}",
        "sequence": event.sequence,
        "job_id": event.job_id,
        "name": event.name,
        "team": event.team,
        "from": event.source.value if event.source else None,
        "to": event.target.value,
        "reason": event.reason,
        "attempt": event.attempt,
        "detail": event.detail,
        "time": event.at.isoformat(),
        **event.extra,
    }


class EventBridgePublisher:
    def __init__(self, *, client: EventBridgeClient, bus_name: str) -> None:
        self._events = client
        self._bus = bus_name

    def publish(self, events: Sequence[StateChanged]) -> None:
        entries: list[PutEventsRequestEntryTypeDef] = [
            {
                "Source": SOURCE,
                "DetailType": STATE_CHANGE,
                "EventBusName": self._bus,
                "Resources": [],
                "Detail": json.dumps(state_change_detail(e)),
                "Time": e.at,
            }
            for e in events
        ]
        for start in range(0, len(entries), PUT_EVENTS_BATCH):
            response = self._events.put_events(Entries=entries[start : start + PUT_EVENTS_BATCH])
            if response.get("FailedEntryCount"):
                failed = [e for e in response["Entries"] if e.get("ErrorCode")]
                raise RuntimeError(f"EventBridge refused {len(failed)} events: {failed[:3]}")

    def publish_notice(self, detail_type: str, detail: dict[str, object]) -> None:
        response = self._events.put_events(
            Entries=[
                {"Source": SOURCE, "DetailType": detail_type, "EventBusName": self._bus, "Detail": json.dumps(detail)}
            ]
        )
        if response.get("FailedEntryCount"):
            raise RuntimeError(f"EventBridge refused {detail_type}: {response['Entries']}")
