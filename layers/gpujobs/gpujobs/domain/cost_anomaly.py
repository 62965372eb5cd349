"""Cost anomalies: whether one is worth acting on, and how to tell a human about it.

Cost Anomaly Detection, unlike AWS Budgets, publishes JSON to EventBridge (`aws.ce`, `Anomaly
Detected`). Its inbound model lives beside the other inbound models (`adapters/inbound_anomaly.py`) and
builds the `CostAnomaly` below: the few facts that the decision and the reason line read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostAnomaly:
    """What a Cost Anomaly Detection event says that a decision reads."""

    anomaly_id: str
    total_impact_usd: float
    """Spend above what was expected, in USD: the one number significance is judged on."""
    total_impact_percentage: float | None = None
    where: tuple[str, ...] = ()
    """The first root cause, as far as it is named: service, usage type, region."""
    monitor_name: str | None = None


def anomaly_is_significant(anomaly: CostAnomaly, *, min_total_impact_usd: float = 100.0) -> bool:
    """Worth acting on: at least `min_total_impact_usd` spent above what was expected."""
    return anomaly.total_impact_usd >= min_total_impact_usd


def anomaly_reason(anomaly: CostAnomaly) -> str:
    """A one-line account for a human: how much, how unusual, where from."""
    text = f"cost anomaly {anomaly.anomaly_id}: ${anomaly.total_impact_usd:,.2f} above expected"
    if anomaly.total_impact_percentage is not None:
        text += f" (+{anomaly.total_impact_percentage:.1f}%)"
    if anomaly.where:
        text += f"; {' / '.join(anomaly.where)}"
    if anomaly.monitor_name:
        text += f"; monitor {anomaly.monitor_name}"
    return text
