"""GPU-idle alarms: one CloudWatch alarm per instance on the CloudWatch agent's NVIDIA metric.

`AWS/EC2` has no GPU metric; the bootstrap starts the CloudWatch agent with
`aggregation_dimensions [["InstanceId"]]`, which publishes `CWAgent / nvidia_smi_utilization_gpu`
with exactly the `InstanceId` dimension an alarm must match. Alarms carry no actions: their state
change reaches the control plane through an EventBridge rule on the name prefix, which checkpoints
before anything is stopped. Missing data is not breaching, so a silent agent never reads as idle
(the alarm goes `OK` on no data at all, and its reason data lists no `recentDatapoints`: how the
reconciler tells a job that its idle detection is off, `domain.idle_detection`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types_boto3_cloudwatch import CloudWatchClient

from gpujobs.contract import JOB_TAG, STACK_TAG, idle_alarm_name
from gpujobs.service.ports import IdleAlarmState

PERIOD_SECONDS = 60


class CloudWatchIdleAlarms:
    def __init__(self, *, client: CloudWatchClient, stack_name: str) -> None:
        self._cw = client
        self._stack = stack_name

    def create(self, *, job_id: str, instance_ids: Sequence[str], below_percent: float, minutes: int) -> None:
        for iid in instance_ids:
            self._cw.put_metric_alarm(
                AlarmName=idle_alarm_name(self._stack, iid),
                AlarmDescription=f"gpujobs {job_id}: GPU utilization below {below_percent}% for {minutes} min",
                Namespace="CWAgent",
                MetricName="nvidia_smi_utilization_gpu",
                Dimensions=[{"Name": "InstanceId", "Value": iid}],
                Statistic="Average",
                Period=PERIOD_SECONDS,
                EvaluationPeriods=minutes,
                DatapointsToAlarm=minutes,
                Threshold=float(below_percent),
                ComparisonOperator="LessThanThreshold",
                TreatMissingData="notBreaching",
                ActionsEnabled=False,
                Tags=[
                    {"Key": STACK_TAG, "Value": self._stack},
                    {"Key": JOB_TAG, "Value": job_id},
                ],
            )

    def delete(self, *, instance_ids: Sequence[str]) -> None:
        names = [idle_alarm_name(self._stack, iid) for iid in instance_ids]
        for start in range(0, len(names), 100):
            self._cw.delete_alarms(AlarmNames=names[start : start + 100])

    def instance_ids(self) -> list[str]:
        return [alarm.instance_id for alarm in self.states()]

    def states(self) -> list[IdleAlarmState]:
        prefix, named = idle_alarm_name(self._stack, "i-"), idle_alarm_name(self._stack, "")
        found: list[IdleAlarmState] = []
        for page in self._cw.get_paginator("describe_alarms").paginate(
            AlarmNamePrefix=prefix, AlarmTypes=["MetricAlarm"]
        ):
            found += [
                IdleAlarmState(
                    instance_id=alarm["AlarmName"].removeprefix(named),
                    state=alarm.get("StateValue", "INSUFFICIENT_DATA"),
                    had_datapoints=_had_datapoints(alarm.get("StateReasonData")),
                )
                for alarm in page.get("MetricAlarms", [])
            ]
        return found


def _had_datapoints(reason_data: str | None) -> bool | None:
    """`recentDatapoints` of an evaluated alarm's reason data; None when it was never evaluated or
    the data is not what CloudWatch writes (judged unknown, never as silent)."""
    try:
        points = json.loads(reason_data)["recentDatapoints"] if reason_data else None
    except (ValueError, TypeError, KeyError):
        return None
    return bool(points) if isinstance(points, list) else None


THROTTLE_LOOKBACK = timedelta(hours=1)
"""As far back as a throttled report can still arrive: the Reports rule's MaximumEventAgeInSeconds."""


class LambdaThrottles:
    """`Ports.reports_throttled_at`: the end of the newest minute in the hour before `now` in which
    the Reports function was throttled (`AWS/Lambda` `Throttles` by `FunctionName`, one
    GetMetricStatistics call); None when it was not."""

    def __init__(self, *, client: CloudWatchClient, function_name: str) -> None:
        self._cw = client
        self._function = function_name

    def __call__(self, now: datetime) -> datetime | None:
        answer = self._cw.get_metric_statistics(
            Namespace="AWS/Lambda",
            MetricName="Throttles",
            Dimensions=[{"Name": "FunctionName", "Value": self._function}],
            StartTime=now - THROTTLE_LOOKBACK,
            EndTime=now,
            Period=PERIOD_SECONDS,
            Statistics=["Sum"],
        )
        throttled = [p["Timestamp"] for p in answer.get("Datapoints", []) if p.get("Sum", 0) > 0]
        return max(throttled) + timedelta(seconds=PERIOD_SECONDS) if throttled else None
