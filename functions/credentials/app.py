"""Job sessions for the instances (invoked directly by the bootstrap; no event source).

The payload is a job id, an attempt and the instance's signed `sts:GetCallerIdentity` proof. The
session is minted only for an instance the jobs table lists in that job's live attempt, with the
tags and session policy rendered from the record (`gpujobs.service.job_sessions`). Every refusal is
logged with the reason naming what did not match, and answered as data, never as a traceback; a
failure of STS or DynamoDB is answered "unavailable" (the bootstrap asks again).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from gpujobs.adapters.inbound_sessions import SessionRequest
from gpujobs.domain.job_sessions import Refusal
from gpujobs.runtime.bootstrap import job_sessions, require_settings
from gpujobs.runtime.observability import logger, metrics, tracer
from gpujobs.runtime.settings import Need
from gpujobs.service.job_sessions import Vended

SETTINGS = require_settings(Need.VEND)


def answer(event: dict[str, Any]) -> Vended:
    try:
        request = SessionRequest.model_validate(event)
    except ValidationError as exc:
        return Vended(refusal=Refusal.MALFORMED_REQUEST, detail=f"{exc.error_count()} invalid field(s)")
    try:
        return job_sessions().vend(request.ask())
    except Exception:  # a dependency failed: said to the caller as retryable, the traceback stays here
        logger.exception("job session not vended", extra={"job_id": request.job_id, "attempt": request.attempt})
        return Vended(refusal=Refusal.UNAVAILABLE, detail="the credentials function could not answer; ask again")


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    vended = answer(event)
    grant = vended.grant
    asked = event if isinstance(event, dict) else {}
    fields = {"job_id": asked.get("job_id"), "attempt": asked.get("attempt"), "detail": vended.detail}
    if grant is not None:
        logger.info("job session granted", extra={**fields, "instance_id": grant.instance_id, "team": grant.team})
        metrics.add_metric(name="JobSessionsGranted", unit=MetricUnit.Count, value=1)
    else:
        assert vended.refusal is not None
        logger.warning("job session refused", extra={**fields, "refusal": vended.refusal.value})
        metrics.add_metric(name="JobSessionsRefused", unit=MetricUnit.Count, value=1)
    return vended.payload()
