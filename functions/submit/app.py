"""SQS -> submissions: job specs to record and launch, and cancel requests.

Thin on purpose: the batch loop (`runtime.sqs_batch`) reports failed records
(ReportBatchItemFailures) so that only a record that met a transient AWS error is retried, and after
the queue's maxReceiveCount it goes to the dead-letter queue. Invalid specs do not fail the record:
the service records them as REJECTED with their reasons, so they are consumed, never retried. The
message's `SenderId` (the IAM principal that sent it) is what the team configuration authorizes; a
cancel from a principal outside the job's team is logged, counted and consumed.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpujobs.domain.states import JobState
from gpujobs.runtime.bootstrap import bind_context, job_service, require_settings
from gpujobs.runtime.observability import logger, metrics, tracer
from gpujobs.runtime.settings import Need
from gpujobs.runtime.sqs_batch import PartialBatchResponse, SqsRecord, process_sqs_batch
from gpujobs.service.jobs import CancelRefusedError
from gpujobs.service.ports import JobNotFoundError

SETTINGS = require_settings(Need.ADMIT, Need.LAUNCH)

_METRIC_FOR_STATE = {JobState.REJECTED: "JobsRejected", JobState.CANCELLED: "JobsCancelled"}


@tracer.capture_method
def record_handler(record: SqsRecord) -> None:
    try:
        outcome = job_service().handle_message(
            record.body, message_id=record.message_id, sender=record.attributes.get("SenderId")
        )
    except JobNotFoundError as exc:  # a cancel naming no job: nothing to retry, say so and consume it
        logger.warning("cancel for an unknown job", extra={"job_id": exc.job_id, "message_id": record.message_id})
        metrics.add_metric(name="CancelsForUnknownJobs", unit=MetricUnit.Count, value=1)
        return
    except CancelRefusedError as exc:  # not the job's team: nothing to retry either
        logger.warning(
            "cancel refused", extra={"job_id": exc.job_id, "sender": exc.sender, "message_id": record.message_id}
        )
        metrics.add_metric(name="CancelsRefused", unit=MetricUnit.Count, value=1)
        return
    job = outcome.job
    logger.info(
        "submission handled",
        extra={"job_id": job.job_id, "state": job.state.value, "new_job": outcome.created, "detail": job.status_detail},
    )
    if not outcome.created and job.state is not JobState.CANCELLED:
        metrics.add_metric(name="DuplicateSubmissions", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name=_METRIC_FOR_STATE.get(job.state, "JobsSubmitted"), unit=MetricUnit.Count, value=1)


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> PartialBatchResponse:
    bind_context(context)
    return process_sqs_batch(event, record_handler)
