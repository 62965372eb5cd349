"""Typed inbound events: the `detail` of the reports our instances publish (checkpoint committed,
heartbeat, job exited), each becoming the domain's report type (`domain.reports`) as it is parsed."""

from __future__ import annotations

from abc import abstractmethod

from pydantic import Field

from gpujobs.adapters.inbound import Detail
from gpujobs.contract import CHECKPOINT_COMMITTED, JOB_EXITED, TRAINING_HEARTBEAT
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
    step: int = Field(ge=0)

    def report(self) -> Report:
        return HeartbeatReport(job_id=self.job_id, attempt=self.attempt, step=self.step)


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
