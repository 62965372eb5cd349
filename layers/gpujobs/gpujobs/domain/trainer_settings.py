"""The spec's `trainer:` section: per-job settings of the trainer runtime, and of its hang check.

Before this section these settings were only reachable through `GPUJOBS_*` variables, which the
spec refuses in `env` (gpujobs sets them). Now a job names them here; the launcher renders them
into the run document as variables (`TrainerSettings.environment`), the bootstrap passes them to the
container beside the rest of its contract, and `gpujobs_trainer.config` reads them. Each default is
the trainer's own default, so a spec without the section trains exactly as before.

`heartbeat_overdue_minutes` and `first_heartbeat_minutes` stay with the control plane: how long the
reconciler waits for the next heartbeat, and for an attempt's first, before it calls the trainer
hung (`domain.hangs`). The first must leave room for several heartbeats, or a healthy job would be
replaced between two of them; the second for boot, the image pull, the process group's start and
the first step (a compile included).
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from gpujobs.contract import TRAINER_SETTING_VARIABLES

StrictInt = Annotated[int, Strict()]
StrictBool = Annotated[bool, Strict()]

HEARTBEATS_PER_OVERDUE_LIMIT = 3
"""The overdue limit spans at least this many heartbeat periods: one lost report is not a hang."""


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class TrainerSettings(BaseModel):
    """How the trainer runtime behaves for this job. See docs/job-spec.md, `trainer:`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collective_timeout_seconds: StrictInt = Field(
        default=120,
        ge=10,
        le=3600,
        description="timeout of the trainer's own collectives (the step-boundary agreement and its barriers); "
        "the script's collectives keep torch's default",
    )
    checkpoint_every_steps: StrictInt = Field(
        default=0, ge=0, le=100_000_000, description="also checkpoint every N steps (0 = off)"
    )
    keep_checkpoints: StrictInt = Field(default=2, ge=2, le=100, description="committed checkpoints kept")
    async_checkpoints: StrictBool = Field(default=True, description="periodic and on-demand saves in the background")
    compile: StrictBool = Field(default=False, description="torch.compile the model in prepare_model()")
    heartbeat_seconds: StrictInt = Field(default=60, ge=10, le=3600, description="seconds between heartbeats")
    heartbeat_overdue_minutes: StrictInt = Field(
        default=15,
        ge=5,
        le=1440,
        description="minutes without a heartbeat after which a running trainer counts as hung and its "
        "instances are replaced",
    )
    first_heartbeat_minutes: StrictInt = Field(
        default=30,
        ge=5,
        le=1440,
        description="minutes after an attempt starts within which its trainer must report its first heartbeat, "
        "or it counts as hung (stuck before training: NCCL/EFA initialisation) and its instances are replaced",
    )
    log_level: LogLevel = LogLevel.INFO

    @model_validator(mode="after")
    def _limits_span_several_heartbeats(self) -> TrainerSettings:
        """The first heartbeat comes one period after the trainer starts: a limit set shorter than a
        few periods would replace a healthy job. The default first-heartbeat limit is not refused
        with a long period (a spec valid before the field existed stays valid); it stretches."""
        limits = {"heartbeat_overdue_minutes": self.heartbeat_overdue_minutes}
        if "first_heartbeat_minutes" in self.model_fields_set:
            limits["first_heartbeat_minutes"] = self.first_heartbeat_minutes
        for name, minutes in limits.items():
            if minutes * 60 < HEARTBEATS_PER_OVERDUE_LIMIT * self.heartbeat_seconds:
                raise ValueError(
                    f"{name} ({minutes}) must span at least "
                    f"{HEARTBEATS_PER_OVERDUE_LIMIT} heartbeats of heartbeat_seconds ({self.heartbeat_seconds})"
                )
        return self

    @property
    def heartbeat_overdue(self) -> timedelta:
        return timedelta(minutes=self.heartbeat_overdue_minutes)

    @property
    def first_heartbeat(self) -> timedelta:
        """`first_heartbeat_minutes`, never shorter than the heartbeats the overdue limit spans."""
        periods = timedelta(seconds=HEARTBEATS_PER_OVERDUE_LIMIT * self.heartbeat_seconds)
        return max(timedelta(minutes=self.first_heartbeat_minutes), periods)

    def environment(self) -> dict[str, str]:
        """The settings that differ from their defaults, as the trainer reads them: one `GPUJOBS_*`
        variable each (booleans as 1/0). A default travels as no variable: the trainer's default is
        the same (a test holds the two equal), and user data, which carries them, is short of room."""
        values = self.model_dump(include=set(TRAINER_SETTING_VARIABLES), exclude_defaults=True)
        return {
            TRAINER_SETTING_VARIABLES[field]: (str(int(value)) if isinstance(value, bool) else str(value))
            for field, value in values.items()
        }
