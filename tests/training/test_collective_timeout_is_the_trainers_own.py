"""The job's collective timeout bounds the trainer's own collectives, never the script's.

Nor does it bound how long ranks may take to reach ``init``: joining the trainer's group is not one
of its collectives.

`trainer.collective_timeout_seconds` (GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS) is how long a rank waits
at the step boundary for its peers before the attempt fails and the control plane restarts it. The
script's collectives (DDP's all-reduces, an evaluation's reductions) keep torch's default: a short
timeout there would end a legitimately slow one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.harness import job_env, run_job

pytestmark = pytest.mark.training
TIMEOUT_SECONDS = 2
SCRIPT = """
import json, os, time
import torch, torch.distributed as dist
import gpujobs_trainer

env = gpujobs_trainer.setup_distributed()
if env.rank == 1:
    time.sleep(4)  # reaches init later than the timeout: joining the trainer's group must still work
model = torch.nn.Linear(2, 2)
run = gpujobs_trainer.init(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))

def report(event, started, **fields):
    print(json.dumps({"event": event, "rank": env.rank, "waited": time.monotonic() - started, **fields}), flush=True)

if env.rank == 1:
    time.sleep(5)  # the script's own collective: rank 1 comes 5 s late
started = time.monotonic()
total = torch.ones(1)
dist.all_reduce(total)
report("script-collective", started, total=total.item())

if env.rank == 1:
    time.sleep(6)  # the trainer's step boundary: rank 1 comes 6 s late
started = time.monotonic()
try:
    run.step_done(1)
except RuntimeError as exc:
    report("step-boundary-failed", started, error=str(exc)[:200])
    os._exit(1)
"""


def test_a_slow_script_collective_completes_and_a_missing_peer_at_the_step_boundary_fails_fast(
    tmp_path: Path,
) -> None:
    script = tmp_path / "late_peer.py"
    script.write_text(SCRIPT)
    env = job_env(
        str(tmp_path / "checkpoints"),
        GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS=str(TIMEOUT_SECONDS),
        GPUJOBS_SHUTDOWN_TIMEOUT="5",
    )

    result = run_job(env, script=script)

    slow = [e for e in result.events("script-collective") if e["rank"] == 0]
    failed = [e for e in result.events("step-boundary-failed") if e["rank"] == 0]
    assert len(slow) == len(failed) == 1, result.output
    assert slow[0]["total"] == 2.0
    assert slow[0]["waited"] > 2 * TIMEOUT_SECONDS  # waited for the late peer, past the job's timeout
    assert TIMEOUT_SECONDS * 0.9 <= failed[0]["waited"] < 5, failed
    assert "timed out" in failed[0]["error"].lower(), failed
    assert result.exit_code != 0
