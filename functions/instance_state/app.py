"""EC2 instance state changes (default bus, aws.ec2): an attempt's instances ending decide its fate.

The event carries no tags: ownership comes from the job store's instance index.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpujobs.adapters.inbound import StateChange, detail_of, envelope
from gpujobs.runtime.bootstrap import bind_context, reactions, require_settings
from gpujobs.runtime.observability import logger, metrics, report, tracer
from gpujobs.runtime.settings import Need

SETTINGS = require_settings(Need.LAUNCH)


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE, clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    bind_context(context)
    change = detail_of(envelope(event), StateChange)
    report(reactions().instance_state(change.instance_id, change.state), instance_id=change.instance_id)
