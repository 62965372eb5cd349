"""Typed inbound events: the `detail` of the reports our instances publish (checkpoint committed,
heartbeat, job exited), each becoming the domain's report type (`domain.reports`) as it is parsed."""

from __future__ import annotations

from abc import abstractmethod
from typing import Annotated

from pydantic import Field, FiniteFloat, StringConstraints

from gpujobs.adapters.inbound import Detail
from gpujobs.contract import (
    CHECKPOINT_COMMITTED,
    JOB_EXITED,
    MAX_HEARTBEAT_METRICS,
    METRIC_NAME_PATTERN,
    TRAINING_HEARTBEAT,
)
from gpujobs.domain.job import MAX_DETAIL_CHARS
from gpujobs.domain.job_ids import JOB_ID
from gpujobs.domain.reports import (
    INSTANCE_ID,
    CheckpointReport,
    ExitReport,
    HeartbeatReport,
    Report,
    SignedReport,
)

JOB_ID_PATTERN = f"^{JOB_ID.pattern}$"
INSTANCE_ID_PATTERN = f"^{INSTANCE_ID.pattern}$"


class _Report(Detail):
    """A report's ids (a malformed one fails validation: ignored and counted, never looked up) and
    its proof (`domain.report_auth`), absent on an unsigned report."""

    job_id: str = Field(pattern=JOB_ID_PATTERN)
    attempt: int = Field(ge=1)
    signed_at: int | None = None
    signature: str | None = Field(default=None, max_length=128)

    @abstractmethod
    def report(self) -> Report:
        """The report as the control plane acts on it."""

    def signed(self) -> SignedReport:
        return SignedReport(self.report(), signed_at=self.signed_at, signature=self.signature)


class CheckpointCommitted(_Report):
    step: int = Field(ge=0)
    uri: str
    reason: str = ""

    def report(self) -> Report:
        return CheckpointReport(job_id=self.job_id, attempt=self.attempt, step=self.step, uri=self.uri)


class Heartbeat(_Report):
    """A trainer's heartbeat. Its metrics are bounded as the trainer bounds them (a heartbeat that
    passes the bounds was not sent by our trainer: it fails validation, ignored and counted)."""

    step: int = Field(ge=0)
    metrics: dict[Annotated[str, StringConstraints(pattern=METRIC_NAME_PATTERN)], FiniteFloat] | None = Field(
        default=None, max_length=MAX_HEARTBEAT_METRICS
    )
    steps_per_second: FiniteFloat | None = Field(default=None, ge=0)
    samples_per_second: FiniteFloat | None = Field(default=None, ge=0)

    def report(self) -> Report:
        if self.metrics is None:  # an older trainer: its rate is not signed, so not acted on
            return HeartbeatReport(job_id=self.job_id, attempt=self.attempt, step=self.step)
        return HeartbeatReport(
            job_id=self.job_id,
            attempt=self.attempt,
            step=self.step,
            metrics=tuple(self.metrics.items()),
            steps_per_second=self.steps_per_second,
            samples_per_second=self.samples_per_second,
        )


class JobExited(_Report):
    exit_code: int
    node_rank: int | None = None
    instance_id: str | None = Field(default=None, pattern=INSTANCE_ID_PATTERN)
    reason: str = ""
    message: str = ""

    def report(self) -> Report:
        return ExitReport(
            job_id=self.job_id,
            attempt=self.attempt,
            exit_code=self.exit_code,
            instance_id=self.instance_id,
            node_rank=self.node_rank,
            message=self.message[:MAX_DETAIL_CHARS],
        )


REPORT_MODELS: dict[str, type[_Report]] = {
    CHECKPOINT_COMMITTED: CheckpointCommitted,
    TRAINING_HEARTBEAT: Heartbeat,
    JOB_EXITED: JobExited,
}
"""The detail model of each report the reports function handles."""
