"""A shared ``state=`` entry that differs by rank is refused at the first save, naming it; never
saved as one rank's copy for all (2 gloo processes under the launcher, a BatchNorm model and an EMA).

The usual case: ``AveragedModel(use_buffers=True)`` averages each rank's own BatchNorm statistics.
Saved as shared state, DCP would keep one rank's EMA and every rank would resume with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujobs_trainer import CONFIG_ERROR_EXIT_CODE, SUCCESS_EXIT_CODE
from tests.training.harness import committed_steps, job_env, run_job

pytestmark = pytest.mark.training
SCRIPT = Path(__file__).with_name("ema_across_ranks.py")


def _env(checkpoints: Path) -> dict[str, str]:
    return job_env(str(checkpoints), GPUJOBS_CHECKPOINT_EVERY_STEPS="5", GPUJOBS_ASYNC_CHECKPOINTS="0")


@pytest.mark.timeout(240)
def test_an_ema_of_each_ranks_batchnorm_stats_given_as_shared_state_stops_the_job_at_its_first_save(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "checkpoints"

    result = run_job(_env(checkpoints), "12", "shared", script=SCRIPT)

    assert result.exit_code == CONFIG_ERROR_EXIT_CODE, result.output
    assert "'ema' differs across ranks" in result.output
    assert "rank 1's ema." in result.output  # names the key that differs
    assert "per_rank()" in result.output
    assert committed_steps(checkpoints) == []  # nothing collapsed was ever committed
    assert not result.events("final")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["per-rank", "layernorm"])
def test_an_ema_each_rank_keeps_as_per_rank_or_one_without_running_stats_trains_to_the_end(
    mode: str, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"

    result = run_job(_env(checkpoints), "12", mode, script=SCRIPT)

    assert result.exit_code == SUCCESS_EXIT_CODE, result.output
    assert "differs across ranks" not in result.output
    assert committed_steps(checkpoints)[-1] == 12
    assert result.final == {"event": "final", "step": 12}
