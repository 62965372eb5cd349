"""Stories of misconfigured jobs: each exits 78 naming the problem and never trains from scratch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpujobs_trainer import CONFIG_ERROR_EXIT_CODE
from tests.training.conftest import Baseline
from tests.training.harness import JobResult, job_env, recommit, run_job
from tests.training.test_checkpoints_round_trip_through_s3 import aws_env  # noqa: F401 (module fixture)

pytestmark = pytest.mark.training


def _never_trained(result: JobResult) -> bool:
    return not any("[digits] step" in line for line in result.lines) and not result.events("final")


def test_a_job_without_a_checkpoint_uri_refuses_to_start(tmp_path: Path) -> None:
    env = job_env("unused")
    del env["GPUJOBS_CHECKPOINT_URI"]
    result = run_job(env, "--steps", "50")
    assert result.exit_code == CONFIG_ERROR_EXIT_CODE, result.output
    assert "GPUJOBS_CHECKPOINT_URI is not set" in result.output
    assert _never_trained(result)


def test_a_checkpoint_bucket_that_cannot_be_reached_stops_the_job(
    tmp_path: Path,
    aws_env: dict[str, str],  # noqa: F811
) -> None:
    env = job_env("s3://no-such-bucket/ckpt", GPUJOBS_LOCAL_CHECKPOINT_DIR=str(tmp_path / "local"), **aws_env)
    result = run_job(env, "--steps", "50")
    assert result.exit_code == CONFIG_ERROR_EXIT_CODE, result.output
    assert "checkpoint URI s3://no-such-bucket/ckpt is unreachable" in result.output
    assert "NoSuchBucket" in result.output
    assert _never_trained(result)


def test_a_committed_checkpoint_that_does_not_load_falls_back_to_the_previous_commit(
    tmp_path: Path, baseline: Baseline
) -> None:
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(baseline.checkpoint_dir, checkpoints)
    shard = checkpoints / "step-00000400" / "__0_0.distcp"
    shard.write_bytes(b"\x00garbage" * (shard.stat().st_size // 8) + b"\x00" * (shard.stat().st_size % 8))
    # The marker vouches for the garbage (say the bytes were corrupted before their digest was
    # taken): it passes verification and fails to load. It used to stop every attempt (78), for
    # good; the job resumes from the commit before it instead, and says why.
    recommit(shard.parent)

    result = run_job(job_env(str(checkpoints)), "--steps", "500")

    assert result.exit_code == 0, result.output
    assert result.resumed_from == 300
    assert "skipping checkpoint step 400: it is committed but does not load" in result.output


def test_a_job_whose_every_commit_fails_to_load_stops_rather_than_starting_over(
    tmp_path: Path, baseline: Baseline
) -> None:
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(baseline.checkpoint_dir, checkpoints)
    for step_dir in checkpoints.glob("step-*"):
        shard = step_dir / "__0_0.distcp"
        shard.write_bytes(b"\x00" * shard.stat().st_size)
        recommit(step_dir)

    result = run_job(job_env(str(checkpoints)), "--steps", "500")

    assert result.exit_code == CONFIG_ERROR_EXIT_CODE, result.output
    assert "committed steps all skipped: step 400: it is committed but does not load" in result.output
    assert _never_trained(result)
