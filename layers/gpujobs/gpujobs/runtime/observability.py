"""Powertools Logger, Metrics and Tracer for the handlers, configured by the template's Globals.

The X-Ray SDK's recorder builds a botocore client when it is imported, which costs about as much as
importing boto3 itself. So the Powertools Tracer is created only when SDK tracing is switched on
(`POWERTOOLS_TRACE_DISABLED=false`, the stack parameter XRaySdkTracing); otherwise handlers get a
tracer with the same decorators that adds nothing. Lambda's active tracing works either way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aws_lambda_powertools import Logger, Metrics, single_metric
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from gpujobs.domain.job_metrics import TEAM_COST

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gpujobs.domain.job_metrics import JobMetric
    from gpujobs.service.ports import JobRecordTooLargeError
    from gpujobs.service.reactions import Reaction

F = TypeVar("F", bound=Callable[..., Any])


class TracerLike(Protocol):
    def capture_lambda_handler(self, lambda_handler: F) -> F: ...

    def capture_method(self, method: F) -> F: ...


class _PassThroughTracer:
    def capture_lambda_handler(self, lambda_handler: F) -> F:
        return lambda_handler

    def capture_method(self, method: F) -> F:
        return method


def sdk_tracing_enabled(env: dict[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get("POWERTOOLS_TRACE_DISABLED", "false")
    return value.strip().lower() not in ("true", "1")


def make_tracer() -> TracerLike:
    if not sdk_tracing_enabled():
        return _PassThroughTracer()
    from aws_lambda_powertools import Tracer

    return Tracer()  # type: ignore[return-value]


logger = Logger()
metrics = Metrics()
tracer = make_tracer()


def report(reaction: Reaction, **context: object) -> None:
    """Log what a reaction did and count its metrics: the one way every handler reports."""
    job = reaction.job
    fields: dict[str, object] = {"outcome": reaction.outcome.value, "detail": reaction.detail, **context}
    if job is not None:
        fields.update(job_id=job.job_id, state=job.state.value, version=job.version)
    logger.info("ignored" if reaction.ignored else "reacted", extra=fields)
    for name, value in reaction.metrics.items():
        metrics.add_metric(
            name=name, unit=MetricUnit.Count if not name.startswith("Seconds") else MetricUnit.Seconds, value=value
        )
    if reaction.ignored:
        metrics.add_metric(name="EventsIgnored", unit=MetricUnit.Count, value=1)


RECORD_TOO_LARGE_METRIC = "JobRecordsTooLarge"
"""Alarmed in template.yaml (JobRecordTooLargeAlarm): a job whose record DynamoDB would refuse."""


def count_record_too_large(error: JobRecordTooLargeError) -> None:
    """The store refused a job's record for its size: say so loudly, once per refused write."""
    logger.error("job record too large", extra={"job_id": error.job_id, "size": error.size, "limit": error.limit})
    metrics.add_metric(name=RECORD_TOO_LARGE_METRIC, unit=MetricUnit.Count, value=1)


class EmfMetrics:
    """`service.ports.MetricsRecorder`: each metric with its own dimensions, written at once as an
    EMF line (`single_metric`), since the handler's `metrics` object has one set of dimensions per
    flush. Cost metrics are in US dollars (unit None), the rest are counts. `single_metric` does not
    read POWERTOOLS_METRICS_DISABLED (the local cloud sets it), so this does."""

    def record(self, metrics: Sequence[JobMetric]) -> None:
        if is_metrics_disabled():
            return
        for metric in metrics:
            unit = MetricUnit.NoUnit if metric.name == TEAM_COST else MetricUnit.Count
            with single_metric(name=metric.name, unit=unit, value=metric.value) as one:
                for name, value in metric.dimensions:
                    one.add_dimension(name=name, value=value)


JOBS_IN_STATE_METRIC = "JobsInState"


def count_jobs_by_state(counts: Mapping[str, int], states: Sequence[str]) -> None:
    """The reconciler's gauge: how many active jobs each state holds now (zeros included, so a
    graph falls to 0 rather than stopping)."""
    if is_metrics_disabled():
        return
    for state in states:
        with single_metric(name=JOBS_IN_STATE_METRIC, unit=MetricUnit.Count, value=counts.get(state, 0)) as one:
            one.add_dimension(name="State", value=state)
