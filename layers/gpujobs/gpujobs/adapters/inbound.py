"""Typed inbound events: the `detail` of each EventBridge event a gpujobs function handles.

Powertools has no models for EC2, CloudWatch alarm or our own events, so they are written here, and
so is the EventBridge envelope they travel in: Powertools' `EventBridgeModel` has the same fields,
but importing it builds every model of its parser package (about a hundred), which cost more than
`import boto3` itself on every cold start. Keys are AWS's own (kebab-case for EC2), extra fields are
allowed (AWS adds fields over time) and `version` is optional because the EC2 state-change
documentation example omits it.

Cost Anomaly Detection's `detail` is modelled leniently, since only its impact is decided on; it
becomes the domain's `CostAnomaly` before any decision reads it.
"""

from __future__ import annotations

from abc import abstractmethod
from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from gpujobs.contract import CHECKPOINT_COMMITTED, JOB_EXITED, TRAINING_HEARTBEAT
from gpujobs.domain.cost_anomaly import CostAnomaly
from gpujobs.domain.job import JOB_ID, MAX_DETAIL_CHARS
from gpujobs.domain.reports import (
    INSTANCE_ID,
    CheckpointReport,
    ExitReport,
    HeartbeatReport,
    Report,
    SignedReport,
)


class _Detail(BaseModel):
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


class SpotWarning(_Detail):
    instance_id: str = Field(alias="instance-id")
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class Rebalance(_Detail):
    instance_id: str = Field(alias="instance-id")


class StateChange(_Detail):
    instance_id: str = Field(alias="instance-id")
    state: str


JOB_ID_PATTERN = f"^{JOB_ID.pattern}$"
INSTANCE_ID_PATTERN = f"^{INSTANCE_ID.pattern}$"


class _Report(_Detail):
    """A report's ids (a malformed one fails validation: ignored and counted, never looked up) and
    its proof (`domain.report_auth`), absent on an unsigned report."""

    job_id: str = Field(pattern=JOB_ID_PATTERN)
    attempt: int = Field(ge=1)
    signed_at: int | None = None
    signature: str | None = Field(default=None, max_length=128)

    @abstractmethod
    def report(self) -> Report:
        """The report as the control plane acts on it."""

    def signed(self) -> SignedReport:
        return SignedReport(self.report(), signed_at=self.signed_at, signature=self.signature)


class CheckpointCommitted(_Report):
    step: int = Field(ge=0)
    uri: str
    reason: str = ""

    def report(self) -> Report:
        return CheckpointReport(job_id=self.job_id, attempt=self.attempt, step=self.step, uri=self.uri)


class Heartbeat(_Report):
    step: int = Field(ge=0)

    def report(self) -> Report:
        return HeartbeatReport(job_id=self.job_id, attempt=self.attempt, step=self.step)


class JobExited(_Report):
    exit_code: int
    node_rank: int | None = None
    instance_id: str | None = Field(default=None, pattern=INSTANCE_ID_PATTERN)
    reason: str = ""
    message: str = ""

    def report(self) -> Report:
        return ExitReport(
            job_id=self.job_id,
            attempt=self.attempt,
            exit_code=self.exit_code,
            instance_id=self.instance_id,
            node_rank=self.node_rank,
            message=self.message[:MAX_DETAIL_CHARS],
        )


REPORT_MODELS: dict[str, type[_Report]] = {
    CHECKPOINT_COMMITTED: CheckpointCommitted,
    TRAINING_HEARTBEAT: Heartbeat,
    JOB_EXITED: JobExited,
}
"""The detail model of each report the reports function handles."""


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


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True, defer_build=True)


class AnomalyScore(_Lenient):
    current_score: float | None = Field(default=None, alias="currentScore")
    max_score: float | None = Field(default=None, alias="maxScore")


class AnomalyImpact(_Lenient):
    total_impact: float = Field(alias="totalImpact")
    """Spend above what was expected, in USD: the one number significance is judged on."""
    max_impact: float | None = Field(default=None, alias="maxImpact")
    total_actual_spend: float | None = Field(default=None, alias="totalActualSpend")
    total_expected_spend: float | None = Field(default=None, alias="totalExpectedSpend")
    total_impact_percentage: float | None = Field(default=None, alias="totalImpactPercentage")


class RootCauseImpact(_Lenient):
    contribution: float | None = None


class RootCause(_Lenient):
    linked_account: str | None = Field(default=None, alias="linkedAccount")
    linked_account_name: str | None = Field(default=None, alias="linkedAccountName")
    region: str | None = None
    service: str | None = None
    usage_type: str | None = Field(default=None, alias="usageType")
    impact: RootCauseImpact | None = None


class AnomalyDetail(_Lenient):
    """The `detail` of an `aws.ce` `Anomaly Detected` event; only the id and total impact are required."""

    anomaly_id: str = Field(alias="anomalyId")
    impact: AnomalyImpact
    account_id: str | None = Field(default=None, alias="accountId")
    account_name: str | None = Field(default=None, alias="accountName")
    anomaly_start_date: datetime | None = Field(default=None, alias="anomalyStartDate")
    anomaly_end_date: datetime | None = Field(default=None, alias="anomalyEndDate")
    anomaly_score: AnomalyScore | None = Field(default=None, alias="anomalyScore")
    dimension_value: str | None = Field(default=None, alias="dimensionValue")
    feedback: str | None = None
    root_causes: list[RootCause] = Field(default_factory=list, alias="rootCauses")
    monitor_arn: str | None = Field(default=None, alias="monitorArn")
    monitor_name: str | None = Field(default=None, alias="monitorName")
    anomaly_details_link: str | None = Field(default=None, alias="anomalyDetailsLink")

    def cost_anomaly(self) -> CostAnomaly:
        """The facts the domain decides on: the impact, and where the first root cause points."""
        cause = self.root_causes[0] if self.root_causes else None
        where = (cause.service, cause.usage_type, cause.region) if cause else ()
        return CostAnomaly(
            anomaly_id=self.anomaly_id,
            total_impact_usd=self.impact.total_impact,
            total_impact_percentage=self.impact.total_impact_percentage,
            where=tuple(part for part in where if part),
            monitor_name=self.monitor_name,
        )


def envelope(event: dict[str, Any]) -> Envelope:
    """The event's envelope; pydantic's ValidationError when it is not an EventBridge event."""
    return Envelope.model_validate(event)


T = TypeVar("T", bound=BaseModel)


def detail_of(event: Envelope, model: type[T]) -> T:
    return model.model_validate(event.detail)
