"""The spec's `trainer:` section: per-job settings of the trainer runtime, and of its hang check.

Before this section these settings were only reachable through `GPUJOBS_*` variables, which the
spec refuses in `env` (gpujobs sets them). Now a job names them here; the launcher renders them
into the run document as variables (`TrainerSettings.environment`), the bootstrap passes them to the
container beside the rest of its contract, and `gpujobs_trainer.config` reads them. Each default is
the trainer's own default, so a spec without the section trains exactly as before.

`heartbeat_overdue_minutes` stays with the control plane: it is how long the reconciler waits for
a heartbeat before it calls the trainer hung (`domain.hangs`). It must leave room for several
heartbeats, or a healthy job would be replaced between two of them.
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
    log_level: LogLevel = LogLevel.INFO

    @model_validator(mode="after")
    def _overdue_spans_several_heartbeats(self) -> TrainerSettings:
        if self.heartbeat_overdue_minutes * 60 < HEARTBEATS_PER_OVERDUE_LIMIT * self.heartbeat_seconds:
            raise ValueError(
                f"heartbeat_overdue_minutes ({self.heartbeat_overdue_minutes}) must span at least "
                f"{HEARTBEATS_PER_OVERDUE_LIMIT} heartbeats of heartbeat_seconds ({self.heartbeat_seconds})"
            )
        return self

    @property
    def heartbeat_overdue(self) -> timedelta:
        return timedelta(minutes=self.heartbeat_overdue_minutes)

    def environment(self) -> dict[str, str]:
        """The settings that differ from their defaults, as the trainer reads them: one `GPUJOBS_*`
        variable each (booleans as 1/0). A default travels as no variable: the trainer's default is
        the same (a test holds the two equal), and user data, which carries them, is short of room."""
        values = self.model_dump(include=set(TRAINER_SETTING_VARIABLES), exclude_defaults=True)
        return {
            TRAINER_SETTING_VARIABLES[field]: (str(int(value)) if isinstance(value, bool) else str(value))
            for field, value in values.items()
        }
