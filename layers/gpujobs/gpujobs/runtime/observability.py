"""Powertools Logger, Metrics and Tracer for the handlers, configured by the template's Globals.

X-Ray SDK tracing is opt-in (`POWERTOOLS_TRACE_DISABLED=false`, the stack parameter
XRaySdkTracing); otherwise handlers get a tracer with the same decorators that adds nothing, and
Lambda's active tracing works either way.

With it on, the Powertools Tracer is built on the first call of a traced function, not at import:
importing the X-Ray SDK (its recorder, and asyncio for the async one) and patching botocore cost
about a third of `import boto3`, which the first invocation now pays instead of the init phase
(`bench/control_plane_bench.py` reports both: the import, and the import with the wiring and the
Tracer that the first invocation builds). The traces stay the same: nothing traced runs before the
first invocation (boto3 clients are made on first use, and the SDK records no subsegment outside an
invocation), the Tracer is built and botocore patched before the handler's body runs, and the real
Tracer's decorators then make the subsegments they made when applied at import (`## handler` with
its ColdStart and Service annotations, `## record_handler`, one per AWS call). Only botocore is
patched: `Tracer()`'s default `patch_all` also wraps requests and sqlite3, which no handler calls
(every outgoing call is botocore's), and importing requests for that cost more than the rest.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

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

    def prepare(self) -> None:
        """Nothing to build: no SDK tracing."""


PATCHED_MODULES = ("botocore",)
"""What the X-Ray SDK patches: every AWS call a handler makes goes through botocore."""


def _powertools_tracer() -> TracerLike:
    from aws_lambda_powertools import Tracer

    return Tracer(patch_modules=PATCHED_MODULES)  # type: ignore[return-value]


class TracerOnFirstCall:
    """The Powertools Tracer's decorators, with the Tracer (and the X-Ray SDK) built on the first
    call of a function they decorate; each function is decorated by the real Tracer then, once."""

    def __init__(self, build: Callable[[], TracerLike] = _powertools_tracer) -> None:
        self._build = build
        self._tracer: TracerLike | None = None

    def prepare(self) -> TracerLike:
        """The Tracer, built now if no traced function has been called yet."""
        if self._tracer is None:
            self._tracer = self._build()
        return self._tracer

    def capture_lambda_handler(self, lambda_handler: F) -> F:
        return self._on_first_call(lambda_handler, lambda tracer: tracer.capture_lambda_handler(lambda_handler))

    def capture_method(self, method: F) -> F:
        return self._on_first_call(method, lambda tracer: tracer.capture_method(method))

    def _on_first_call(self, function: F, decorate: Callable[[TracerLike], F]) -> F:
        traced: list[F] = []

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not traced:
                traced.append(decorate(self.prepare()))
            return traced[0](*args, **kwargs)

        return cast(F, call)


def sdk_tracing_enabled(env: dict[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get("POWERTOOLS_TRACE_DISABLED", "false")
    return value.strip().lower() not in ("true", "1")


def make_tracer() -> _PassThroughTracer | TracerOnFirstCall:
    return TracerOnFirstCall() if sdk_tracing_enabled() else _PassThroughTracer()


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


TEAM_GPUS_METRIC = "TeamGpus"
TEAM_QUOTA_METRIC = "TeamGpuQuota"


def count_team_gpus(teams: Mapping[str, tuple[int, int | None]]) -> None:
    """The reconciler's per-team gauge: GPUs its jobs hold (the ledger) and its quota, if it has one."""
    if is_metrics_disabled():
        return
    for team, (held, quota) in teams.items():
        for name, value in ((TEAM_GPUS_METRIC, held), (TEAM_QUOTA_METRIC, quota)):
            if value is None:
                continue
            with single_metric(name=name, unit=MetricUnit.Count, value=value) as one:
                one.add_dimension(name="Team", value=team)


JOBS_IN_STATE_METRIC = "JobsInState"


def count_jobs_by_state(counts: Mapping[str, int], states: Sequence[str]) -> None:
    """The reconciler's gauge: how many active jobs each state holds now (zeros included, so a
    graph falls to 0 rather than stopping)."""
    if is_metrics_disabled():
        return
    for state in states:
        with single_metric(name=JOBS_IN_STATE_METRIC, unit=MetricUnit.Count, value=counts.get(state, 0)) as one:
            one.add_dimension(name="State", value=state)
