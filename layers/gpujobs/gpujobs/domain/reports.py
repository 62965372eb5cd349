"""What an instance reports about its attempt, as the control plane acts on it.

The inbound models (`adapters.inbound`) parse an event's detail into one of these; the reports
service verifies its proof (`domain.report_auth`) over `signed_fields()`, the very values it then
acts on, before any decision reads it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import ClassVar

from gpujobs.contract import CHECKPOINT_COMMITTED, JOB_EXITED, TRAINING_HEARTBEAT, report_signed_field_names

INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
"""An EC2 instance id (the short 8-digit form is still seen on old accounts)."""


@dataclass(frozen=True)
class _Report:
    DETAIL_TYPE: ClassVar[str]

    job_id: str
    attempt: int

    def signed_fields(self) -> dict[str, object]:
        values = self._values()
        return {name: values[name] for name in report_signed_field_names(self.DETAIL_TYPE, values)}

    def _values(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class CheckpointReport(_Report):
    DETAIL_TYPE: ClassVar[str] = CHECKPOINT_COMMITTED

    step: int
    uri: str


@dataclass(frozen=True)
class HeartbeatReport(_Report):
    DETAIL_TYPE: ClassVar[str] = TRAINING_HEARTBEAT

    step: int
    metrics: tuple[tuple[str, float], ...] | None = None
    """The script's newest metrics, by name; None from a trainer older than metrics (whose
    throughput is then unsigned, so not recorded)."""
    steps_per_second: float | None = None
    samples_per_second: float | None = None

    def _values(self) -> dict[str, object]:
        values = asdict(self)
        values["metrics"] = None if self.metrics is None else dict(self.metrics)
        return values


@dataclass(frozen=True)
class ExitReport(_Report):
    DETAIL_TYPE: ClassVar[str] = JOB_EXITED

    exit_code: int
    instance_id: str | None = None
    node_rank: int | None = None
    message: str = ""
    """Why the node exited, in words: shown to users, never acted on, so outside the signature."""


Report = CheckpointReport | HeartbeatReport | ExitReport


@dataclass(frozen=True)
class SignedReport:
    """A report and the proof it came with (absent fields: an unsigned report)."""

    report: Report
    signed_at: int | None = None
    signature: str | None = None
