"""What a job's training reported as it ran: the newest step, metrics and throughput, and a bounded
series of them (`gpujobs status`, `gpujobs metrics`).

The trainer's heartbeats carry the script's metrics (`run.log`, `step_done(metrics=)`) and the rate;
each heartbeat the record writes (`decisions.on_heartbeat`, at most one per heartbeat interval)
becomes a point. The record is one DynamoDB item, so the series keeps the newest
`MAX_PROGRESS_POINTS` points and counts the rest; a heartbeat at a step already in the series (a
keep-alive inside `run.busy()`, or the same heartbeat delivered twice) replaces that point rather
than adding one. With at most `contract.MAX_HEARTBEAT_METRICS` short names a point, the series
stays a few tens of KB at most (tests/service/test_bounded_record.py). The points of all attempts
share the series: after a resume the step goes back to the checkpoint's, and each point names its
attempt.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gpujobs.domain.values import Frozen

MAX_PROGRESS_POINTS = 60
"""Points kept: at the default heartbeat period (one written each 30 s at most), the last half hour
or more (a job reporting less often keeps a longer span)."""


class ProgressPoint(Frozen):
    """One recorded heartbeat: where training was, what it measured, how fast it went."""

    at: datetime
    """When the control plane recorded it."""
    attempt: int
    step: int
    metrics: dict[str, float] = Field(default_factory=dict)
    steps_per_second: float | None = None
    samples_per_second: float | None = None
    """None when the job's spec does not give its samples per step."""


class Progress(Frozen):
    """The newest `MAX_PROGRESS_POINTS` points, oldest first, and how many older ones were let go."""

    points: tuple[ProgressPoint, ...] = ()
    dropped: int = 0

    @property
    def latest(self) -> ProgressPoint | None:
        return self.points[-1] if self.points else None

    def with_point(self, point: ProgressPoint) -> Progress:
        """This series with `point` as its newest, in place of any point of the same attempt and step."""
        points = (*(p for p in self.points if (p.attempt, p.step) != (point.attempt, point.step)), point)
        over = max(0, len(points) - MAX_PROGRESS_POINTS)
        return Progress(points=points[over:], dropped=self.dropped + over)
