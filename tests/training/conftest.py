"""Shared, expensive fixtures: one uninterrupted baseline run that every resume test compares to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.training.harness import TOTAL_STEPS, JobResult, job_env, run_job


@dataclass(frozen=True)
class Baseline:
    result: JobResult
    state_dump: Path
    checkpoint_dir: Path


@pytest.fixture(scope="session")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """400 uninterrupted steps, seed 1234, a periodic (async) checkpoint every 100 steps."""
    root = tmp_path_factory.mktemp("baseline")
    checkpoints = root / "checkpoints"
    dump = root / "state.pt"
    result = run_job(
        job_env(str(checkpoints)),
        "--steps",
        str(TOTAL_STEPS),
        "--checkpoint-every-steps",
        "100",
        "--state-dump",
        str(dump),
    )
    assert result.exit_code == 0, result.output
    return Baseline(result=result, state_dump=dump, checkpoint_dir=checkpoints)
