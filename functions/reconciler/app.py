"""Every minute: read the active jobs and the live instances, and repair whatever events were lost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpujobs.domain.states import ACTIVE_STATES
from gpujobs.runtime.bootstrap import bind_context, reconciler, require_settings
from gpujobs.runtime.observability import count_jobs_by_state, count_team_gpus, logger, metrics, tracer
from gpujobs.runtime.settings import Need

SETTINGS = require_settings(Need.LAUNCH, Need.SIGNAL)


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    bind_context(context)
    # Launch work stops short of the function's own timeout, so the repairs are never the work cut off.
    deadline = datetime.now(UTC) + timedelta(milliseconds=context.get_remaining_time_in_millis())
    result = reconciler().run(deadline=deadline)
    repairs = {what.value: count for what, count in result.repairs.items()}
    logger.info(
        "reconciled", extra={"active_jobs": result.active_jobs, "live_instances": result.live_instances, **repairs}
    )
    metrics.add_metric(name="ActiveJobs", unit=MetricUnit.Count, value=result.active_jobs)
    count_jobs_by_state(result.jobs_by_state, [state.value for state in ACTIVE_STATES])
    count_team_gpus(result.team_gpus)
    for what, count in result.repairs.items():
        metrics.add_metric(name=what.metric_name, unit=MetricUnit.Count, value=count)
    return {"active_jobs": result.active_jobs, "live_instances": result.live_instances, "repairs": repairs}
