"""The Hugging Face Trainer recipe under ``checkpoint: directory``: stopped mid-training, it saves the
step it is at (its SaveOnPreemption callback), and the next attempt, on a fresh folder restored
from the synced copy, resumes there and ends where an uninterrupted run ends.

2 gloo processes under the launcher. What "the same" means here is measured and asserted exactly:
every loss after the resume and the final weights equal the uninterrupted run's, bit for bit (the
Trainer saves every rank's RNG state and replays the epoch's seeded order, skipping the batches
already trained on).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from gpujobs_trainer import PREEMPTED_EXIT_CODE
from tests.training.harness import REPO, JobResult, assert_bit_identical, job_env, run_job, start_job

pytest.importorskip("transformers")
pytestmark = [pytest.mark.training, pytest.mark.slow]
SCRIPT = REPO / "training_image" / "examples" / "recipes" / "hf_trainer.py"
STEPS = 40
_LOSS = re.compile(r'"event": "loss", "step": (\d+)')


def _env(tmp_path: Path, run: str) -> dict[str, str]:
    folder = tmp_path / run
    folder.mkdir()
    return job_env(str(tmp_path / "synced"), GPUJOBS_CHECKPOINT_MODE="directory", TMPDIR=str(folder))


def losses(result: JobResult) -> dict[int, float]:
    return {int(e["step"]): float(e["loss"]) for e in result.events("loss")}


@pytest.mark.timeout(600)
def test_a_trainer_job_stopped_by_sigterm_saves_that_step_and_resumes_with_the_same_losses_and_weights(
    tmp_path: Path,
) -> None:
    baseline_dump = tmp_path / "baseline.pt"
    alone = job_env(str(tmp_path / "alone"), GPUJOBS_CHECKPOINT_MODE="directory", TMPDIR=str(tmp_path))
    baseline = run_job(alone, "--steps", str(STEPS), "--state-dump", str(baseline_dump), script=SCRIPT, timeout=240)
    assert baseline.exit_code == 0, baseline.output
    expected = losses(baseline)
    assert sorted(expected) == list(range(1, STEPS + 1))

    job = start_job(_env(tmp_path, "first"), "--steps", str(STEPS), "--step-sleep", "0.2", script=SCRIPT)
    job.wait_for(lambda line: bool((m := _LOSS.search(line)) and int(m.group(1)) >= 13), timeout=180)
    job.signal(signal.SIGTERM)
    interrupted = job.finish(timeout=240)
    assert interrupted.exit_code == PREEMPTED_EXIT_CODE, interrupted.output
    [stop] = interrupted.events("preempted")
    assert 13 <= stop["step"] < STEPS  # usually a step the Trainer's save_steps (10) would not have saved

    resumed_dump = tmp_path / "resumed.pt"
    resumed = run_job(
        _env(tmp_path, "replacement"),
        "--steps",
        str(STEPS),
        "--state-dump",
        str(resumed_dump),
        script=SCRIPT,
        timeout=240,
    )

    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == stop["step"]
    assert losses(resumed) == {step: loss for step, loss in expected.items() if step > stop["step"]}
    assert_bit_identical(baseline_dump, resumed_dump)
