"""State changes, published from the jobs table's stream (the outbox: `gpujobs.service.outbox`).

Every write of a job is a stream record with the item's old and new image; this function puts the
transitions each write added on the stack's bus as `GPU Job State Change`, in the order of the
writes. A batch answers with the first record whose events could not be put (a partial batch
response): Lambda reads the batch again from that record, so a job's events go out in its order,
at least once, never lost to a handler that died after its write.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpujobs.adapters.job_stream import stream_record
from gpujobs.runtime.bootstrap import outbox, require_settings
from gpujobs.runtime.observability import logger, metrics, tracer

SETTINGS = require_settings()


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    records = event.get("Records") or []
    done = outbox().publish([stream_record(record) for record in records])
    logger.info(
        "published",
        extra={
            "records": len(records),
            "events": done.events,
            "unreadable": done.unreadable,
            "failed_at": done.failed_at,
        },
    )
    metrics.add_metric(name="StateChangesPublished", unit=MetricUnit.Count, value=done.events)
    if done.unreadable:
        metrics.add_metric(name="StateChangesUnreadable", unit=MetricUnit.Count, value=done.unreadable)
    if done.failed_at is None:
        return {"batchItemFailures": []}
    metrics.add_metric(name="StateChangesRetried", unit=MetricUnit.Count, value=1)
    return {"batchItemFailures": [{"itemIdentifier": done.failed_at}]}
