"""A worker that dies or hangs in its teardown after it reported success does not turn a finished
job into a crash or a hung attempt; one that dies before reporting it does crash the job.

torch can abort a process as it exits ("terminate called without an active exception", SIGABRT,
from C++ threads at interpreter teardown); torchrun then exits 1 although training ended and its
final checkpoint is committed. The trainer's `finish()` reports success only once that checkpoint
is committed, so the launcher exits 0 when every local worker reported it, and says why in its log.
Here the script aborts its own process (SIGABRT), as torch does, either after `finish()` or before.
torch can also deadlock there (a gloo thread freeing a collective's tensors waits for the GIL that
the main thread holds while it joins that thread); the script stands for that with a long sleep
after `finish()`, and the launcher ends it once the grace after the last report is over.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujobs_trainer import CRASH_EXIT_CODE, SUCCESS_EXIT_CODE
from tests.training.harness import committed_steps, job_env, run_job

pytestmark = pytest.mark.training
SCRIPT = """
import os, sys, time
import torch
import gpujobs_trainer

env = gpujobs_trainer.setup_distributed()
model = torch.nn.Linear(2, 2)
run = gpujobs_trainer.init(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
for step in range(run.step + 1, 4):
    run.step_done(step)
if sys.argv[1] == "before" and env.rank == 0:
    os.abort()
code = run.finish()
if sys.argv[1] == "after" and env.rank == 0:
    os.abort()
if sys.argv[1] == "hang" and env.rank == 0:
    time.sleep(600)  # SIGTERM runs the trainer's handler, which only sets a flag: the sleep goes on
sys.exit(code)
"""


@pytest.mark.parametrize(
    ("when", "exit_code", "committed"),
    [("after", SUCCESS_EXIT_CODE, [3]), ("before", CRASH_EXIT_CODE, [])],
)
def test_an_abort_after_finish_reported_success_leaves_the_job_succeeded(
    tmp_path: Path, when: str, exit_code: int, committed: list[int]
) -> None:
    script = tmp_path / "aborts.py"
    script.write_text(SCRIPT)
    checkpoints = tmp_path / "checkpoints"

    result = run_job(job_env(str(checkpoints), GPUJOBS_SHUTDOWN_TIMEOUT="5"), when, script=script)

    assert result.exit_code == exit_code, result.output
    assert committed_steps(checkpoints) == committed
    teardown = "before a worker died in its teardown" in result.output
    assert teardown is (when == "after"), result.output


def test_a_worker_that_hangs_after_reporting_success_is_ended_and_the_job_succeeds(tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text(SCRIPT)
    checkpoints = tmp_path / "checkpoints"
    env = job_env(str(checkpoints), GPUJOBS_SHUTDOWN_TIMEOUT="5", GPUJOBS_TEARDOWN_GRACE_SECONDS="2")

    result = run_job(env, "hang", script=script, timeout=120)  # the sleep alone would take 600 s

    assert result.exit_code == SUCCESS_EXIT_CODE, result.output
    assert committed_steps(checkpoints) == [3]
    assert "stuck in their teardown" in result.output, result.output
