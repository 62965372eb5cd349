"""Errors the trainer runtime raises on purpose, and the exit codes it promises.

The exit codes are a contract with the control plane: it decides from them whether to resume
(75), to give up on a misconfigured job (78) or to treat the attempt as a crash (anything else).
"""

from __future__ import annotations

SUCCESS_EXIT_CODE = 0
"""Training finished; the final checkpoint is committed."""

PREEMPTED_EXIT_CODE = 75
"""EX_TEMPFAIL: interrupted (spot notice or SIGTERM), a checkpoint is committed, resume me."""

CONFIG_ERROR_EXIT_CODE = 78
"""EX_CONFIG: bad environment, unreachable checkpoint URI or unusable checkpoint. Retrying the
same configuration will fail the same way; training never silently starts from scratch instead."""

SYNC_FAILED_EXIT_CODE = 74
"""EX_IOERR, ``checkpoint: directory`` only: the script ended (it succeeded, or was stopped from outside)
but the last sync of its folder failed after retries, so what it saved since the previous sync is not
in S3. Not a crash of the script: a retry resumes from the last complete sync."""

SLOW_INTERCONNECT_EXIT_CODE = 123
"""A multi-node gang's all-reduce bus bandwidth, measured by the launcher before any of the job's code
ran (`interconnect`), is below the floor the bootstrap set (GPUJOBS_INTERCONNECT_FLOOR_GBS: a quarter
of the type's network). Not the job's fault: the control plane relaunches the gang on other hosts
without spending an attempt."""

COMMAND_NOT_EXECUTABLE_EXIT_CODE = 126
"""The training command's program exists but cannot be executed (as a shell and `docker run` report it)."""

COMMAND_NOT_FOUND_EXIT_CODE = 127
"""The training command's program does not exist (as a shell and `docker run` report it)."""

CRASH_EXIT_CODE = 1
"""Anything else: the workers crashed or were killed before reporting an outcome."""


class TrainerError(Exception):
    """Base class for errors raised by gpujobs_trainer."""


class ConfigError(TrainerError):
    """The environment the bootstrap provided is missing or inconsistent."""


class CheckpointError(TrainerError):
    """A checkpoint location cannot be used, or a committed checkpoint cannot be restored."""
