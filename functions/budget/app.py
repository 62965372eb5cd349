"""Budget signals: AWS Budgets notifications over SNS (plain text) and Cost Anomaly Detection.

A forecasted breach or a significant anomaly: launches become spot-only and a warning is
published. An actual breach: launches are held and the scope's running jobs are checkpointed, then
stopped. Unparseable text is logged and counted, never treated as a breach.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from gpujobs.adapters.inbound import detail_of, envelope
from gpujobs.adapters.inbound_anomaly import AnomalyDetail
from gpujobs.contract import ANOMALY_DETECTED
from gpujobs.runtime.bootstrap import budget_reactions, require_settings
from gpujobs.runtime.observability import logger, metrics, report, tracer
from gpujobs.runtime.settings import Need

SETTINGS = require_settings(Need.SIGNAL)


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    if "Records" in event:  # SNS: AWS Budgets
        for record in event["Records"]:
            sns = record["Sns"]
            reaction = budget_reactions().budget_notification(subject=sns.get("Subject"), message=sns["Message"])
            report(reaction, sns_message_id=sns.get("MessageId"))
        return
    anomaly = detail_of(envelope(event), AnomalyDetail).cost_anomaly()
    report(budget_reactions().cost_anomaly(anomaly), event=ANOMALY_DETECTED)
