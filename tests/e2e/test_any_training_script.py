"""Any training script on the local cloud: an unmodified torchrun script, its code shipped by `submit`.

The script (`tests/training/own_snapshots_train.py`) knows torchrun and a checkpoint folder, nothing
of gpujobs: its own argparse, its own `torch.save` snapshots, its own resume from the newest one, no
signal handler. The user ships it with `code:` (a folder `gpujobs submit` packs and uploads) and
`checkpoint: directory`; a rebalance notice leaves it training, a spot warning interrupts it, and
the replacement resumes from the script's own snapshot.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from unittest import mock

import pytest

from gpujobs.domain.states import JobState
from gpujobs_cli.main import main as gpujobs_cli
from tests.e2e.conftest import TYPES, Stage

pytestmark = [pytest.mark.integration, pytest.mark.training]

SCRIPT = Path(__file__).resolve().parents[1] / "training" / "own_snapshots_train.py"
STEPS = 300


def _saved_steps(stage: Stage, instance_id: str) -> list[int]:
    lines = [json.loads(line) for line in stage.log_text(instance_id).splitlines() if line.startswith('{"event"')]
    return [line["step"] for line in lines if line["event"] == "saved"]


@pytest.mark.timeout(300)
def test_an_unmodified_torchrun_script_survives_a_rebalance_and_resumes_from_its_own_snapshot_after_a_spot_warning(
    stage: Stage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a folder holding a script written for any cluster, and a spec that ships it as code
    (tmp_path / "code").mkdir()
    shutil.copy(SCRIPT, tmp_path / "code" / "train.py")
    spec = {
        "name": "own-snapshots",
        "image": "local/gpujobs-train:dev",
        "command": ["python", "train.py", "--steps", str(STEPS), "--save-every", "10", "--step-sleep", "0.1"],
        "gpus_per_node": 2,
        "instance_types": list(TYPES),
        "capacity": "spot-first",
        "team": "e2e",
        "checkpoint": "directory",
        "code": "./code",
    }
    (tmp_path / "job.yaml").write_text(json.dumps(spec))  # JSON is YAML
    # Each instance starts in its own folder, as a container starts in its image's WORKDIR.
    stage.runner.cwd = None

    # when the user submits it with the CLI
    with mock.patch.dict(os.environ, stage.cloud.exports()):
        assert gpujobs_cli(["submit", str(tmp_path / "job.yaml")]) == 0
    job_id = capsys.readouterr().out.strip()
    (first,) = stage.wait_running(job_id).instance_ids
    stage.wait("the script's own snapshot at step 30", lambda: max(_saved_steps(stage, first), default=0) >= 30, 120)

    # and EC2 first recommends a rebalance: the script, which handles no SIGUSR1, trains on
    stage.runner.rebalance(first)
    stage.wait("training on after the rebalance notice", lambda: max(_saved_steps(stage, first)) >= 50, 60)
    assert stage.state(job_id) is JobState.RUNNING

    # and then EC2 reclaims the spot instance (notice, then termination 10 s later)
    stage.runner.interrupt_spot(first, notice_seconds=10)

    # then the job succeeds on a replacement, counted as an interruption, not a crash
    job = stage.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=200)
    assert job.state is JobState.SUCCEEDED, job.status_detail
    assert (job.interruptions, job.crashes) == (1, 0)
    reclaimed, replacement = job.attempts
    assert reclaimed.end_reason == "interrupted"
    # and the replacement resumed from the newest snapshot the script wrote before it was stopped
    last_saved = max(_saved_steps(stage, first))
    assert 30 <= last_saved < STEPS
    (second,) = replacement.instance_ids
    assert stage.trainer_line(second, "resumed") == {"event": "resumed", "step": last_saved}
    assert stage.trainer_line(second, "final") == {"event": "final", "step": STEPS, "resumed_from": last_saved}
    stage.wait_nothing_running()
