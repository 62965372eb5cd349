"""The spec's `trainer:` section reaches the trainer as the settings the user wrote, and only those.

A user cannot set `GPUJOBS_*` variables in `env` (gpujobs sets them), so the section is how a job
tunes the trainer: these tests follow a setting from the spec, through the run document the
launcher renders and the environment the bootstrap builds, to what `gpujobs_trainer.config` reads.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from gpujobs.contract import TRAINER_SETTING_VARIABLES
from gpujobs.domain.rundoc import RunDocument
from gpujobs.domain.spec import SpecError, validate_spec
from gpujobs.domain.trainer_settings import TrainerSettings
from gpujobs.instance.rundoc import check_document
from gpujobs.instance.workload_env import container_env
from gpujobs_trainer.config import TrainerConfig

BASE: dict[str, Any] = {
    "name": "digits",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge"],
}
TUNED = {
    "collective_timeout_seconds": 600,
    "checkpoint_every_steps": 500,
    "keep_checkpoints": 3,
    "async_checkpoints": False,
    "compile": True,
    "heartbeat_seconds": 30,
    "heartbeat_overdue_minutes": 45,
    "log_level": "debug",
}


def environment_of(trainer: dict[str, Any]) -> dict[str, str]:
    """What the container of a job with this `trainer:` section is given, launcher to bootstrap."""
    spec = validate_spec({**BASE, "trainer": trainer})
    doc = RunDocument(
        job_id="j-0123456789abcdef",
        attempt=1,
        name=spec.name,
        image=spec.image,
        command=list(spec.command),
        checkpoint_uri="s3://bucket/jobs/j-0123456789abcdef/ckpt",
        trainer_env=spec.trainer.environment(),
    )
    checked = check_document(doc.model_dump(mode="json"))
    return container_env(checked, rank=0, master_addr="10.0.0.1", instance_id="i-0123456789abcdef0", region="r")


def test_a_spec_without_the_section_trains_exactly_as_before() -> None:
    spec = validate_spec(BASE)

    assert spec.trainer == TrainerSettings()
    assert spec.trainer.environment() == {}
    assert not set(environment_of({})) & set(TRAINER_SETTING_VARIABLES.values())


def test_every_setting_written_in_the_spec_is_what_the_trainer_reads() -> None:
    env = environment_of(TUNED)
    config = TrainerConfig.from_env(env)

    assert config.collective_timeout_seconds == 600
    assert config.checkpoint_every_steps == 500
    assert config.keep_checkpoints == 3
    assert config.async_checkpoints is False
    assert config.compile is True
    assert config.heartbeat_seconds == 30
    assert env["GPUJOBS_LOG_LEVEL"] == "debug"
    assert "heartbeat_overdue_minutes" not in TRAINER_SETTING_VARIABLES  # the control plane's, not the trainer's
    assert "first_heartbeat_minutes" not in TRAINER_SETTING_VARIABLES


def test_the_trainers_defaults_are_the_specs_so_a_default_needs_no_variable() -> None:
    defaults = TrainerSettings()
    config = TrainerConfig.from_env({"GPUJOBS_CHECKPOINT_URI": "/tmp/ckpt"})

    for field in set(TRAINER_SETTING_VARIABLES) - {"log_level"}:
        assert getattr(config, field) == getattr(defaults, field), field
    assert defaults.log_level.upper() == logging.getLevelName(logging.INFO)  # run.py's default level


def test_the_containers_contract_wins_over_a_setting_of_the_same_name() -> None:
    env = environment_of({"checkpoint_every_steps": 7})

    assert env["GPUJOBS_CHECKPOINT_EVERY_STEPS"] == "7"
    assert env["GPUJOBS_JOB_ID"] == "j-0123456789abcdef"


@pytest.mark.parametrize(
    ("trainer", "problem"),
    [
        ({"colective_timeout_seconds": 60}, "trainer.colective_timeout_seconds: unknown field"),
        ({"compile": "yes"}, "trainer.compile: Input should be a valid boolean"),
        (
            {"collective_timeout_seconds": 5},
            "trainer.collective_timeout_seconds: Input should be greater than or equal",
        ),
        ({"keep_checkpoints": 1}, "trainer.keep_checkpoints: Input should be greater than or equal to 2"),
        ({"log_level": "verbose"}, "trainer.log_level: Input should be 'debug', 'info', 'warning' or 'error'"),
        ({"first_heartbeat_minutes": 2}, "trainer.first_heartbeat_minutes: Input should be greater than or equal to 5"),
        ({"first_heartbeat_minutes": 30.5}, "trainer.first_heartbeat_minutes: Input should be a valid integer"),
        (
            {"heartbeat_seconds": 900, "heartbeat_overdue_minutes": 45, "first_heartbeat_minutes": 30},
            "trainer: first_heartbeat_minutes (30) must span at least 3 heartbeats of heartbeat_seconds (900)",
        ),
        (
            {"heartbeat_seconds": 600, "heartbeat_overdue_minutes": 15},
            "trainer: heartbeat_overdue_minutes (15) must span at least 3 heartbeats of heartbeat_seconds (600)",
        ),
    ],
)
def test_a_bad_setting_is_refused_naming_it(trainer: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError) as refused:
        validate_spec({**BASE, "trainer": trainer})

    assert any(p.startswith(problem) for p in refused.value.problems), refused.value.problems


def test_the_default_first_heartbeat_limit_stretches_to_a_long_heartbeat_period() -> None:
    """A spec written before the field existed, with a long period, stays valid and is not cut short."""
    long_period = validate_spec({**BASE, "trainer": {"heartbeat_seconds": 1200, "heartbeat_overdue_minutes": 60}})

    assert TrainerSettings().first_heartbeat == timedelta(minutes=30)
    assert long_period.trainer.first_heartbeat == timedelta(minutes=60)
