"""Typed inbound events: the `detail` of each EventBridge event a gpujobs function handles.

Powertools has no models for EC2, CloudWatch alarm or our own events, so they are written here and
plugged into its `EventBridgeModel`. Keys are AWS's own (kebab-case for EC2), extra fields are
allowed (AWS adds fields over time) and `version` is optional because the EC2 state-change
documentation example omits it.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field


class _Detail(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Envelope(EventBridgeModel):
    version: str = "0"
    detail: dict[str, Any]


class SpotWarning(_Detail):
    instance_id: str = Field(alias="instance-id")
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class Rebalance(_Detail):
    instance_id: str = Field(alias="instance-id")


class StateChange(_Detail):
    instance_id: str = Field(alias="instance-id")
    state: str


class CheckpointCommitted(_Detail):
    job_id: str
    attempt: int
    step: int = Field(ge=0)
    uri: str
    reason: str = ""


class Heartbeat(_Detail):
    job_id: str
    attempt: int
    step: int = Field(ge=0)


class JobExited(_Detail):
    job_id: str
    attempt: int
    exit_code: int
    node_rank: int | None = None
    instance_id: str | None = None
    reason: str = ""


class _Metric(_Detail):
    namespace: str = ""
    name: str = ""
    dimensions: dict[str, str] = Field(default_factory=dict)


class _MetricStat(_Detail):
    metric: _Metric


class _AlarmMetric(_Detail):
    id: str = ""
    metric_stat: _MetricStat | None = Field(default=None, alias="metricStat")


class _AlarmConfiguration(_Detail):
    metrics: list[_AlarmMetric] = Field(default_factory=list)


class _AlarmState(_Detail):
    value: Literal["OK", "ALARM", "INSUFFICIENT_DATA"]


class AlarmStateChange(_Detail):
    alarm_name: str = Field(alias="alarmName")
    state: _AlarmState
    configuration: _AlarmConfiguration = Field(default_factory=_AlarmConfiguration)

    @property
    def instance_id(self) -> str | None:
        for metric in self.configuration.metrics:
            if metric.metric_stat and "InstanceId" in metric.metric_stat.metric.dimensions:
                return metric.metric_stat.metric.dimensions["InstanceId"]
        return None


def envelope(event: dict[str, Any]) -> Envelope:
    return parse(event=event, model=Envelope)


T = TypeVar("T", bound=BaseModel)


def detail_of(event: Envelope, model: type[T]) -> T:
    return model.model_validate(event.detail)
