"""`bench/gpu_check.py --ddp-compare` on a machine with fewer than 2 GPUs says so and succeeds.

The comparison itself (gpujobs trainer vs bare torchrun DDP) needs NCCL on >= 2 GPUs; on this CPU
machine the story is only that it skips, by name, without failing a check script that runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.training

GPU_CHECK = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def test_the_ddp_comparison_is_skipped_naming_the_gpu_count() -> None:
    done = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--ddp-compare"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert "skipped: 0 GPU(s)" in done.stdout
