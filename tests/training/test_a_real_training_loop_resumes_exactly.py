"""Stories of a training loop as ML engineers write it (tests/training/loader_job.py: a shuffling
DistributedSampler, a StatefulDataLoader with two workers, random augmentation, BatchNorm, dropout,
a GradScaler, an EMA, a best-loss tracker and a per-rank counter), stopped by SIGTERM and resumed
(2 ranks, gloo, torchrun through the launcher).

The resumed run must train on exactly the batches the uninterrupted run trained on, augmented the
same way, and end with bit-identical state on every rank.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from gpujobs_trainer import PREEMPTED_EXIT_CODE
from gpujobs_trainer.safe_load import load_metadata
from tests.training.harness import commit_of, committed_steps, job_env, run_job, start_job

pytestmark = [pytest.mark.training, pytest.mark.slow]

LOADER_JOB = Path(__file__).with_name("loader_job.py")
STEPS = 100  # 32 batches per epoch and rank: the run crosses three epoch boundaries


def _batches(log_dir: Path, rank: int) -> dict[int, dict[str, Any]]:
    lines = (log_dir / f"rank{rank}.jsonl").read_text().splitlines()
    return {record["step"]: record for record in map(json.loads, lines)}


def _assert_equal_states(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal_states(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal_states(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_sigterm_with_loader_workers_checkpoints_and_the_resumed_run_trains_on_the_same_batches(
    tmp_path: Path,
) -> None:
    # Given an uninterrupted run, the reference
    baseline = run_job(
        job_env(str(tmp_path / "baseline-checkpoints")),
        *("--steps", str(STEPS), "--log-dir", str(tmp_path / "baseline"), "--state-dump", str(tmp_path / "baseline")),
        script=LOADER_JOB,
    )
    assert baseline.exit_code == 0, baseline.output

    # When the same job gets SIGTERM mid-epoch, while two loader workers per rank are busy
    checkpoints = tmp_path / "checkpoints"
    env = job_env(str(checkpoints))
    job = start_job(
        env, *("--steps", str(STEPS), "--log-dir", str(tmp_path / "first"), "--step-sleep", "0.05"), script=LOADER_JOB
    )
    job.wait_for(lambda line: "[loader-job] step 40/" in line)
    job.signal(signal.SIGTERM)
    interrupted = job.finish()

    # Then it saved a preemption checkpoint instead of crashing on its killed workers
    assert interrupted.exit_code == PREEMPTED_EXIT_CODE, interrupted.output
    assert "DataLoader worker" not in interrupted.output
    [step] = committed_steps(checkpoints)
    assert 40 <= step < STEPS
    assert commit_of(checkpoints, step)["reason"] == "preempted"
    keys = load_metadata(checkpoints / f"step-{step:08d}" / ".metadata").state_dict_metadata
    assert {"app.per_rank.rank00000.loader", "app.per_rank.rank00001.loader"} <= set(keys)
    assert {"app.per_rank.rank00000.seen", "app.per_rank.rank00001.seen"} <= set(keys)
    assert "app.extras.scaler.scale" in keys

    # And the resumed run trains on exactly the batches the uninterrupted run did after that step
    resumed = run_job(
        env,
        *("--steps", str(STEPS), "--log-dir", str(tmp_path / "resumed"), "--state-dump", str(tmp_path / "resumed")),
        script=LOADER_JOB,
    )
    assert resumed.exit_code == 0, resumed.output
    for rank in (0, 1):
        reference = _batches(tmp_path / "baseline", rank)
        before, after = _batches(tmp_path / "first", rank), _batches(tmp_path / "resumed", rank)
        assert sorted(after) == list(range(step + 1, STEPS + 1))
        assert all(before[s] == reference[s] for s in range(1, step + 1))
        assert [after[s] for s in after] == [reference[s] for s in after]
        # and every rank ends bit-identical: weights, BatchNorm statistics, Adam moments, LR
        # schedule, GradScaler, EMA, best loss and its own sample counter
        _assert_equal_states(
            torch.load(tmp_path / f"baseline.rank{rank}.pt", weights_only=True),
            torch.load(tmp_path / f"resumed.rank{rank}.pt", weights_only=True),
            where=f"rank {rank}",
        )
