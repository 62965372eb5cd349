"""Typed inbound events: the `detail` of a CloudWatch alarm state change (the idle alarms)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpujobs.adapters.inbound import Detail


class _Metric(Detail):
    namespace: str = ""
    name: str = ""
    dimensions: dict[str, str] = Field(default_factory=dict)


class _MetricStat(Detail):
    metric: _Metric


class _AlarmMetric(Detail):
    id: str = ""
    metric_stat: _MetricStat | None = Field(default=None, alias="metricStat")


class _AlarmConfiguration(Detail):
    metrics: list[_AlarmMetric] = Field(default_factory=list)


class _AlarmState(Detail):
    value: Literal["OK", "ALARM", "INSUFFICIENT_DATA"]


class AlarmStateChange(Detail):
    alarm_name: str = Field(alias="alarmName")
    state: _AlarmState
    configuration: _AlarmConfiguration = Field(default_factory=_AlarmConfiguration)

    @property
    def instance_id(self) -> str | None:
        for metric in self.configuration.metrics:
            if metric.metric_stat and "InstanceId" in metric.metric_stat.metric.dimensions:
                return metric.metric_stat.metric.dimensions["InstanceId"]
        return None
