"""Typed inbound events: the `detail` of a Cost Anomaly Detection event.

Modelled leniently, since only its impact is decided on; it becomes the domain's `CostAnomaly`
before any decision reads it.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from gpujobs.domain.cost_anomaly import CostAnomaly


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
