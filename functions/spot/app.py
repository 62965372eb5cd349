"""EC2 spot interruption warnings and rebalance recommendations (default bus, aws.ec2).

A warning: the job goes INTERRUPTED, the container is told to checkpoint now (SSM; its own IMDS
watcher may already have seen it) and the replacement is launched at once in another pool. A
rebalance recommendation: checkpoint now, nothing else.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpujobs.adapters.inbound import Rebalance, SpotWarning, detail_of, envelope
from gpujobs.contract import SPOT_INTERRUPTION_WARNING
from gpujobs.runtime.bootstrap import bind_context, reactions, require_settings
from gpujobs.runtime.observability import logger, metrics, report, tracer
from gpujobs.runtime.settings import Need

SETTINGS = require_settings(Need.LAUNCH, Need.SIGNAL)

WARNING = SPOT_INTERRUPTION_WARNING


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE, clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    bind_context(context)
    received = envelope(event)
    if received.detail_type == WARNING:
        warning = detail_of(received, SpotWarning)
        report(reactions().spot_warning(warning.instance_id, action=warning.instance_action), event=WARNING)
    else:
        rebalance = detail_of(received, Rebalance)
        report(reactions().rebalance(rebalance.instance_id), event=received.detail_type)
