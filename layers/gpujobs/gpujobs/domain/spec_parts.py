"""The parts of a job spec that are values of their own: its markets, checkpoint modes, idle policy,
deadline, priority classes and durations (`domain.spec` holds the spec itself and re-exports these)."""

from __future__ import annotations

import re
from datetime import timedelta
from enum import StrEnum
from typing import Annotated

from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Field, Strict, model_validator

StrictInt = Annotated[int, Strict()]
StrictNumber = Annotated[float, Strict(), AllowInfNan(allow_inf_nan=False)]
"""Numbers must be numbers (YAML `yes` or JSON "2" is an error, not 1 or 2) and finite (`.inf`, `.nan` are not)."""


class Capacity(StrEnum):
    """Which EC2 market a job may run on."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    SPOT_FIRST = "spot-first"


class IdleAction(StrEnum):
    STOP = "stop"
    IGNORE = "ignore"


class CheckpointMode(StrEnum):
    """How a job takes part in checkpointing (docs/job-spec.md, "Any training script")."""

    GPUJOBS = "gpujobs"
    """The script uses `gpujobs_trainer`: it saves on request (SIGUSR1) and on preemption (SIGTERM)."""
    DIRECTORY = "directory"
    """The script saves and loads its own files under `$GPUJOBS_CHECKPOINT_DIR`; the launcher syncs
    that folder to S3 and restores it. It never gets SIGUSR1; stops and spot warnings send SIGTERM."""
    NONE = "none"
    """Nothing is saved: every attempt starts from scratch. Never signalled to checkpoint."""

    @property
    def takes_checkpoint_requests(self) -> bool:
        """Whether the workload understands "checkpoint now" (SIGUSR1) and reports its commits."""
        return self is CheckpointMode.GPUJOBS


class IdlePolicy(BaseModel):
    """When a job's GPUs count as idle, and what to do about it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_util_below_percent: StrictNumber = Field(default=5, ge=0, le=100)
    for_minutes: StrictInt = Field(default=30, ge=5, le=1440)
    action: IdleAction = IdleAction.STOP


class Deadline(BaseModel):
    """Finish by `hours` after submission, as cheaply as that allows (`domain.deadline`).

    The control plane cannot see inside the training, so the spec says how much work there is:
    `expected_hours` of uninterrupted training on the spec's instances to reach `total_steps`. Work
    done is the newest committed checkpoint's step, the only progress a replacement can resume from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hours: StrictNumber = Field(gt=0, le=720, description="the deadline, in hours after submission")
    expected_hours: StrictNumber = Field(gt=0, le=720, description="uninterrupted training time of the whole job")
    total_steps: StrictInt = Field(ge=1, description="the step the job ends at (its checkpoints count steps)")

    @model_validator(mode="after")
    def _work_fits(self) -> Deadline:
        if self.expected_hours > self.hours:
            raise ValueError(
                f"expected_hours {self.expected_hours:g} cannot fit before the deadline ({self.hours:g} h)"
            )
        return self


class Priority(StrEnum):
    """A job's priority class: the order its team's jobs are admitted in, and what may preempt
    what (`domain.admission`). A team's configuration caps the class its jobs may ask for."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"

    @property
    def rank(self) -> int:
        return PRIORITY_RANKS[self]


PRIORITY_RANKS = {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2}


_DURATION = re.compile(r"^(?:(\d{1,3})h)?(?:(\d{1,4})m)?$")
MAX_KEEP_ON_FAILURE = timedelta(hours=24)
"""The longest a failed gang is kept up for inspection: it is billed all that time."""


def duration(text: str) -> timedelta:
    """`30m`, `2h` or `1h30m` as a timedelta; ValueError for anything else."""
    match = _DURATION.match(text)
    if not text or match is None:
        raise ValueError(f"{text!r} is not a duration such as 30m, 2h or 1h30m")
    hours, minutes = match.groups()
    return timedelta(hours=int(hours or 0), minutes=int(minutes or 0))


def _keep_duration(text: object) -> str:
    if not isinstance(text, str):  # YAML's `30` is a number: say which unit is missing
        raise ValueError(f"{text!r} is not a duration such as 30m, 2h or 1h30m (give the unit)")
    kept = duration(text)
    if not timedelta(minutes=1) <= kept <= MAX_KEEP_ON_FAILURE:
        raise ValueError(f"{text} is not between 1m and 24h")
    return text


KeepDuration = Annotated[str, BeforeValidator(_keep_duration)]
"""A `keep_on_failure` duration: hours and/or minutes (`30m`, `2h`, `1h30m`), from 1 minute to 24 hours."""
