"""Typed inbound events: the EventBridge envelope and the `detail` of the EC2 events gpujobs handles.

Powertools has no models for EC2, CloudWatch alarm or our own events, so they are written here and
beside this module, and so is the EventBridge envelope they travel in: Powertools' `EventBridgeModel`
has the same fields, but importing it builds every model of its parser package (about a hundred),
which cost more than `import boto3` itself on every cold start. Keys are AWS's own (kebab-case for
EC2), extra fields are allowed (AWS adds fields over time) and `version` is optional because the EC2
state-change documentation example omits it.

One module per source, so that each function builds only the models of the events it receives:
`inbound_reports` (our instances' reports), `inbound_alarms` (CloudWatch alarm state changes),
`inbound_anomaly` (Cost Anomaly Detection).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field


class Detail(BaseModel):
    """What every `detail` model shares: extra fields allowed, fields by name or by AWS's key."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)


class Envelope(BaseModel):
    """An EventBridge event as delivered to a target (the fields of Powertools' `EventBridgeModel`)."""

    model_config = ConfigDict(populate_by_name=True, defer_build=True)

    version: str = "0"
    id: str
    source: str
    account: str
    time: datetime
    region: str
    resources: list[str]
    detail_type: str = Field(alias="detail-type")
    detail: dict[str, Any]
    replay_name: str | None = Field(default=None, alias="replay-name")


class SpotWarning(Detail):
    instance_id: str = Field(alias="instance-id")
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class Rebalance(Detail):
    instance_id: str = Field(alias="instance-id")


class StateChange(Detail):
    instance_id: str = Field(alias="instance-id")
    state: str


def envelope(event: dict[str, Any]) -> Envelope:
    """The event's envelope; pydantic's ValidationError when it is not an EventBridge event."""
    return Envelope.model_validate(event)


T = TypeVar("T", bound=BaseModel)


def detail_of(event: Envelope, model: type[T]) -> T:
    return model.model_validate(event.detail)
