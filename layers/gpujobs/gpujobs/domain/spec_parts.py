"""The parts of a job spec that are values of their own: its markets, checkpoint modes, idle policy,
deadline, priority classes, durations and dependencies (`domain.spec` holds the spec itself and re-exports these)."""

from __future__ import annotations

import re
from datetime import timedelta
from enum import StrEnum
from typing import Annotated

from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    model_validator,
)

StrictInt = Annotated[int, Strict()]
StrictNumber = Annotated[float, Strict(), AllowInfNan(allow_inf_nan=False)]
"""Numbers must be numbers (YAML `yes` or JSON "2" is an error, not 1 or 2) and finite (`.inf`, `.nan` are not)."""
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 and C1 controls and DEL; tab and newline are allowed in command arguments and env values."""


def printable(text: str) -> str:
    found = CONTROL_CHARACTERS.search(text)
    if found:
        raise ValueError(f"contains the control character U+{ord(found.group()):04X}; only tab and newline are allowed")
    return text


Text = Annotated[str, StringConstraints(max_length=4096), AfterValidator(printable)]


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
# ---- dependencies: `setup:` and `requirements:` (docs/job-spec.md, "Dependencies") -------------
MAX_SETUP_COMMANDS = 32
MAX_SETUP_ARGUMENTS = 256
MAX_SETUP_CHARS = 4096
MAX_REQUIREMENTS_PATH_CHARS = 255
SHELL = ("/bin/sh", "-c")
"""What a `setup:` string is run by, inside the job's container (never on the host)."""


def _one_setup_command(command: object) -> object:
    """A non-empty string, or a non-empty list of strings, all printable; said in the user's terms."""
    if isinstance(command, str):
        if not command.strip():
            raise ValueError("is empty: give a command, such as 'pip install --user einops'")
        words = [command]
    elif isinstance(command, list) and command and all(isinstance(word, str) for word in command):
        if len(command) > MAX_SETUP_ARGUMENTS:
            raise ValueError(f"has {len(command)} arguments, at most {MAX_SETUP_ARGUMENTS}")
        words = command
    else:
        raise ValueError("must be a string (run by /bin/sh -c in the container) or a non-empty list of arguments")
    for index, word in enumerate(words):
        where = f"argument {index}: " if isinstance(command, list) else ""
        if len(word) > MAX_SETUP_CHARS:
            raise ValueError(f"{where}has {len(word)} characters, at most {MAX_SETUP_CHARS}")
        try:
            printable(word)
        except ValueError as exc:
            raise ValueError(f"{where}{exc}") from None
    return command


def _a_list_of_commands(commands: object) -> object:
    if isinstance(commands, str):
        raise ValueError(f"must be a list of commands: write setup: [{commands[:60]!r}]")
    if isinstance(commands, list) and len(commands) > MAX_SETUP_COMMANDS:
        raise ValueError(f"has {len(commands)} commands, at most {MAX_SETUP_COMMANDS}")
    return commands


SetupCommand = Annotated[str | list[str], BeforeValidator(_one_setup_command)]
"""One `setup:` command: an argv list run as is, or a string run by `/bin/sh -c` in the container."""
SetupCommands = Annotated[
    list[SetupCommand], BeforeValidator(_a_list_of_commands), Field(max_length=MAX_SETUP_COMMANDS)
]


def setup_argv(command: str | list[str]) -> list[str]:
    """The argv a `setup:` command runs as: a string through the container's `/bin/sh -c`."""
    return [*SHELL, command] if isinstance(command, str) else list(command)


def _inside_the_code(path: str) -> str:
    """A relative POSIX path inside the unpacked `code:` folder; nothing that could lead out of it."""
    if path.startswith("/"):
        raise ValueError(f"{path[:80]!r} is absolute: give a path inside code:, such as requirements.txt")
    if "\\" in path or any(part in ("", ".", "..") for part in path.split("/")):
        raise ValueError(f"{path[:80]!r} must be a file's path inside code:, without '..', '.', '//' or '\\'")
    return path


RequirementsPath = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_REQUIREMENTS_PATH_CHARS),
    AfterValidator(printable),
    AfterValidator(_inside_the_code),
]
