"""A final save after the process group is gone (Accelerate's `end_training()`) fails clearly and
commits nothing; the job resumes from the commit before it.

DCP run without a process group saves every rank's files as rank 0's, into one folder: the final
checkpoint was committed with a `.metadata` that another rank had overwritten, failed its digest,
and, being the only commit of a short job or the newest of a long one, blocked every retry (78).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujobs_trainer import CRASH_EXIT_CODE
from tests.training.harness import committed_steps, job_env, run_job

pytestmark = pytest.mark.training
SCRIPT = Path(__file__).with_name("ends_training_first.py")


@pytest.mark.timeout(240)
def test_a_save_after_end_training_fails_clearly_and_the_job_resumes_from_the_last_good_commit(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "checkpoints"
    env = job_env(str(checkpoints), GPUJOBS_CHECKPOINT_EVERY_STEPS="10", GPUJOBS_ASYNC_CHECKPOINTS="0")

    first = run_job(env, "25", script=SCRIPT)

    assert first.exit_code == CRASH_EXIT_CODE, first.output
    assert "cannot save step 25: the process group is gone" in first.output
    assert committed_steps(checkpoints) == [10, 20]
    assert not (checkpoints / "step-00000025").exists()

    again = run_job(env, "25", script=SCRIPT)

    assert again.events("resumed") == [{"event": "resumed", "step": 20, "skipped": []}]
