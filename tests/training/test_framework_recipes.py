"""Framework recipes: plain DDP, FSDP2 and Hugging Face Accelerate loops survive a preemption.

Each recipe (`training_image/examples/recipes/`) runs under the launcher on 2 gloo processes,
is stopped by SIGTERM mid-training, and is resumed by a fresh launcher: every loss after the
resume and the final weights, optimizer state and LR schedule must equal those of an uninterrupted
run. Lightning has no recipe: docs/training.md says why it is not supported by the library.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from gpujobs_trainer import PREEMPTED_EXIT_CODE
from tests.training.harness import (
    REPO,
    JobResult,
    assert_bit_identical,
    commit_of,
    committed_steps,
    job_env,
    run_job,
    start_job,
)

pytestmark = [pytest.mark.training, pytest.mark.slow]
RECIPES = REPO / "training_image" / "examples" / "recipes"
STEPS = 40
_LOSS = re.compile(r'"event": "loss", "step": (\d+)')


def losses(result: JobResult) -> dict[int, float]:
    return {int(e["step"]): float(e["loss"]) for e in result.events("loss")}


@pytest.mark.parametrize("recipe", ["ddp", "fsdp2", "accelerate_ddp", "accelerate_loader"])
def test_a_recipe_stopped_by_sigterm_resumes_with_the_same_losses_and_weights(recipe: str, tmp_path: Path) -> None:
    script = RECIPES / f"{recipe}.py"
    baseline_dump = tmp_path / "baseline.pt"
    baseline = run_job(
        job_env(str(tmp_path / "baseline")), "--steps", str(STEPS), "--state-dump", str(baseline_dump), script=script
    )
    assert baseline.exit_code == 0, baseline.output
    expected = losses(baseline)
    assert sorted(expected) == list(range(1, STEPS + 1))

    checkpoints = tmp_path / "checkpoints"
    env = job_env(str(checkpoints))
    job = start_job(env, "--steps", str(STEPS), "--step-sleep", "0.1", script=script)
    job.wait_for(lambda line: bool((m := _LOSS.search(line)) and int(m.group(1)) >= 10))
    job.signal(signal.SIGTERM)
    interrupted = job.finish()
    assert interrupted.exit_code == PREEMPTED_EXIT_CODE, interrupted.output
    assert not [line for line in interrupted.lines if "SignalException" in line]  # a clean stop reads as one
    [saved] = committed_steps(checkpoints)
    assert commit_of(checkpoints, saved)["reason"] == "preempted"
    assert 10 <= saved < STEPS

    resumed_dump = tmp_path / "resumed.pt"
    resumed = run_job(env, "--steps", str(STEPS), "--state-dump", str(resumed_dump), script=script)

    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == saved
    assert losses(resumed) == {step: loss for step, loss in expected.items() if step > saved}
    assert_bit_identical(baseline_dump, resumed_dump)
