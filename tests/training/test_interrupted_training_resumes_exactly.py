"""Stories of a digits job that gets interrupted and comes back (2 ranks, gloo, torchrun).

Each interrupted run is resumed by a fresh launcher process, and its final weights, Adam moments
and LR schedule must be bit-identical to the uninterrupted baseline with the same seed.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from gpujobs_trainer import PREEMPTED_EXIT_CODE
from tests.training.conftest import Baseline
from tests.training.harness import (
    TOTAL_STEPS,
    FakeImds,
    assert_bit_identical,
    commit_of,
    committed_steps,
    job_env,
    run_job,
    start_job,
)

pytestmark = pytest.mark.training
SLOW_STEPS = ("--step-sleep", "0.02")  # ~50 steps/s, so an interruption lands mid-training


def _resume_and_compare(env: dict[str, str], tmp_path: Path, baseline: Baseline, interrupted_at: int) -> None:
    dump = tmp_path / "resumed.pt"
    resumed = run_job(env, "--steps", str(TOTAL_STEPS), "--state-dump", str(dump))
    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == interrupted_at
    assert resumed.final["step"] == TOTAL_STEPS
    assert_bit_identical(baseline.state_dump, dump)


def test_the_uninterrupted_digits_job_learns_to_recognise_held_out_digits(baseline: Baseline) -> None:
    final = baseline.result.final
    assert final["step"] == TOTAL_STEPS
    assert final["accuracy"] >= 0.9
    assert committed_steps(baseline.checkpoint_dir) == [300, 400]  # two kept, older purged


def test_a_spot_notice_saves_the_same_step_on_every_rank_and_the_resume_is_exact(
    tmp_path: Path, baseline: Baseline
) -> None:
    checkpoints = tmp_path / "checkpoints"
    with FakeImds() as imds:
        env = job_env(
            str(checkpoints),
            GPUJOBS_IMDS="auto",
            AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint,
            GPUJOBS_IMDS_POLL_SECONDS="0.1",
        )
        job = start_job(env, "--steps", str(TOTAL_STEPS), *SLOW_STEPS)
        job.wait_for_step(100)
        imds.announce_termination()
        interrupted = job.finish()

    assert interrupted.exit_code == PREEMPTED_EXIT_CODE, interrupted.output
    assert not interrupted.events("final")
    [step] = committed_steps(checkpoints)
    assert 100 <= step < TOTAL_STEPS
    commit = commit_of(checkpoints, step)
    assert commit["reason"] == "preempted"
    assert commit["world_size"] == 2
    shard_names = {f["name"] for f in commit["files"]}
    assert {"rng-rank-00000.json", "rng-rank-00001.json", ".metadata"} <= shard_names
    assert any(r == ("PUT", "/latest/api/token") for r in imds.requests)

    _resume_and_compare(job_env(str(checkpoints)), tmp_path, baseline, interrupted_at=step)


def test_sigterm_to_the_container_checkpoints_exits_75_and_resumes_exactly(tmp_path: Path, baseline: Baseline) -> None:
    checkpoints = tmp_path / "checkpoints"
    env = job_env(str(checkpoints))
    job = start_job(env, "--steps", str(TOTAL_STEPS), *SLOW_STEPS)
    job.wait_for_step(150)
    job.signal(signal.SIGTERM)
    interrupted = job.finish()

    assert interrupted.exit_code == PREEMPTED_EXIT_CODE, interrupted.output
    [step] = committed_steps(checkpoints)
    assert commit_of(checkpoints, step)["reason"] == "preempted"
    _resume_and_compare(env, tmp_path, baseline, interrupted_at=step)


def test_sigusr1_commits_a_checkpoint_and_training_carries_on_unchanged(tmp_path: Path, baseline: Baseline) -> None:
    checkpoints = tmp_path / "checkpoints"
    dump = tmp_path / "state.pt"
    job = start_job(job_env(str(checkpoints)), "--steps", str(TOTAL_STEPS), "--state-dump", str(dump), *SLOW_STEPS)
    job.wait_for_step(100)
    job.signal(signal.SIGUSR1)
    job.wait_for(lambda line: "committed (on-demand)" in line)
    result = job.finish()

    assert result.exit_code == 0, result.output
    assert result.final["step"] == TOTAL_STEPS
    steps = committed_steps(checkpoints)
    assert steps[-1] == TOTAL_STEPS
    assert commit_of(checkpoints, TOTAL_STEPS)["reason"] == "final"
    on_demand = [s for s in steps if commit_of(checkpoints, s)["reason"] == "on-demand"]
    assert len(on_demand) == 1
    assert 100 <= on_demand[0] < TOTAL_STEPS
    assert_bit_identical(baseline.state_dump, dump)  # checkpointing did not perturb training


def test_a_checkpoint_cut_short_before_its_marker_is_skipped_for_the_previous_one(
    tmp_path: Path, baseline: Baseline
) -> None:
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(baseline.checkpoint_dir, checkpoints)
    (checkpoints / "step-00000400" / "COMMIT.json").unlink()  # killed between .metadata and COMMIT

    dump = tmp_path / "resumed.pt"
    resumed = run_job(job_env(str(checkpoints)), "--steps", str(TOTAL_STEPS), "--state-dump", str(dump))

    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == 300  # a periodic, asynchronously saved checkpoint
    assert "without COMMIT.json" in resumed.output
    assert_bit_identical(baseline.state_dump, dump)
