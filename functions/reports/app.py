"""Reports from the training container and the instance bootstrap (the stack's own bus).

`Checkpoint Committed` moves the job's newest checkpoint forward only; `Training Heartbeat`
records progress; `Job Exited` records a node's exit code and lets the attempt be judged. Each is
acted on only when it proves it comes from the attempt it names (`gpujobs.service.reports`): any
job can put events on the bus, so a forged or malformed report is ignored and counted.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from gpujobs.adapters.inbound import Envelope, detail_of, envelope
from gpujobs.adapters.inbound_reports import REPORT_MODELS
from gpujobs.domain.effects import Outcome
from gpujobs.runtime.bootstrap import bind_context, reports, require_settings
from gpujobs.runtime.observability import logger, metrics, report, tracer
from gpujobs.runtime.settings import Need
from gpujobs.service.reactions import Reaction

SETTINGS = require_settings(Need.LAUNCH)


def react(event: Envelope) -> Reaction:
    model = REPORT_MODELS.get(event.detail_type)
    if model is None:
        return Reaction(Outcome.UNKNOWN_REPORT, detail=repr(event.detail_type))
    try:
        received = detail_of(event, model)
    except ValidationError as exc:
        return Reaction(Outcome.MALFORMED, detail=f"{event.detail_type}: {exc.error_count()} invalid field(s)")
    return reports().receive(received.signed())


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE, clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    bind_context(context)
    received = envelope(event)
    report(react(received), event=received.detail_type, source=received.source)
