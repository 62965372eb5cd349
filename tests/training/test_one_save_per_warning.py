"""A spot warning reaches the trainer three ways; it saves once (2 ranks, gloo, torchrun).

The control plane's checkpoint-now (SIGUSR1), the IMDS notice and SIGTERM arrive within seconds of
each other. They used to make a save each; now they make one: the first of them starts it at once
(a checkpoint-now no longer waits for a preemption to join it), and a preemption within the window
of its start joins it. A preemption later than that saves again, for the steps run since.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from gpujobs_trainer import PREEMPTED_EXIT_CODE
from gpujobs_trainer.coalescing import COALESCE_SECONDS
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
SLOW_STEPS = ("--step-sleep", "0.02")  # ~50 steps/s, so the signals land mid-training
STARTUP_SECONDS = 180.0  # to step 100: two workers importing torch on a shared 2-core machine can take minutes


def _watched_env(checkpoints: Path, imds: FakeImds) -> dict[str, str]:
    # The regular poll is far apart: only the look a checkpoint-now request triggers can find the notice.
    return job_env(
        str(checkpoints),
        GPUJOBS_IMDS="auto",
        AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint,
        GPUJOBS_IMDS_POLL_SECONDS="60",
    )


@pytest.mark.timeout(360)
def test_checkpoint_now_the_notice_and_sigterm_within_one_warning_commit_one_save(
    tmp_path: Path, baseline: Baseline
) -> None:
    # given a job training on a spot instance
    checkpoints = tmp_path / "checkpoints"
    with FakeImds() as imds:
        job = start_job(_watched_env(checkpoints, imds), "--steps", str(TOTAL_STEPS), *SLOW_STEPS)
        job.wait_for_step(100, timeout=STARTUP_SECONDS)

        # when the warning comes: the control plane's SIGUSR1, the notice, then SIGTERM, within a second
        job.signal(signal.SIGUSR1)
        time.sleep(0.2)
        imds.announce_termination()
        time.sleep(0.3)
        job.signal(signal.SIGTERM)
        interrupted = job.finish()

    # then one checkpoint is committed, the one checkpoint-now started at once, and the job exits 75
    assert interrupted.exit_code == PREEMPTED_EXIT_CODE, interrupted.output
    [step] = committed_steps(checkpoints)
    assert 100 <= step < TOTAL_STEPS
    assert commit_of(checkpoints, step)["reason"] in ("on-demand", "preempted")  # "preempted" if SIGTERM came first
    assert interrupted.output.count("committed (") == 1

    # and the next attempt resumes from it exactly
    dump = tmp_path / "resumed.pt"
    resumed = run_job(job_env(str(checkpoints)), "--steps", str(TOTAL_STEPS), "--state-dump", str(dump))
    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == step
    assert_bit_identical(baseline.state_dump, dump)


@pytest.mark.timeout(360)
def test_the_notice_already_up_when_checkpoint_now_arrives_makes_it_the_preemption_save(tmp_path: Path) -> None:
    # given a job whose instance has the spot notice up, not yet seen by the watcher's regular poll
    checkpoints = tmp_path / "checkpoints"
    with FakeImds() as imds:
        job = start_job(_watched_env(checkpoints, imds), "--steps", str(TOTAL_STEPS), *SLOW_STEPS)
        job.wait_for_step(100, timeout=STARTUP_SECONDS)
        imds.announce_termination()

        # when the control plane's checkpoint-now arrives
        job.signal(signal.SIGUSR1)
        interrupted = job.finish()

    # then the save that request started became the preemption checkpoint: one save, exit 75, no SIGTERM needed
    assert interrupted.exit_code == PREEMPTED_EXIT_CODE, interrupted.output
    assert len(committed_steps(checkpoints)) == 1
    assert interrupted.output.count("committed (") == 1


@pytest.mark.timeout(360)
def test_a_preemption_after_the_window_saves_again_only_for_the_steps_run_since(tmp_path: Path) -> None:
    # given a job that was asked to checkpoint now, with no notice in sight
    checkpoints = tmp_path / "checkpoints"
    with FakeImds() as imds:
        job = start_job(_watched_env(checkpoints, imds), "--steps", str(TOTAL_STEPS), *SLOW_STEPS)
        job.wait_for_step(100, timeout=STARTUP_SECONDS)
        job.signal(signal.SIGUSR1)
        job.wait_for(lambda line: "committed (on-demand)" in line)

        # when SIGTERM comes after the window (counted from the save's start), with training gone on
        time.sleep(COALESCE_SECONDS + 0.5)
        job.signal(signal.SIGTERM)
        interrupted = job.finish()

    # then a second, final save holds the steps run since, and nothing else was saved
    assert interrupted.exit_code == PREEMPTED_EXIT_CODE, interrupted.output
    on_demand, preempted = committed_steps(checkpoints)
    assert commit_of(checkpoints, on_demand)["reason"] == "on-demand"
    assert commit_of(checkpoints, preempted)["reason"] == "preempted"
    assert on_demand < preempted < TOTAL_STEPS
