"""End to end on the local cloud: a job exports its model, and the user lists and downloads it.

The real handlers launch the instance, the real bootstrap gives the trainer its output folder and
uploads it with the job's credentials, and `gpujobs artifacts` / `gpujobs download` read it with
what `gpujobs local up` exports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest
from safetensors.torch import load_file

from gpujobs.domain.states import JobState
from gpujobs_cli.main import main as gpujobs_cli
from tests.e2e.conftest import Stage, digits_spec

pytestmark = [pytest.mark.integration, pytest.mark.training]


@pytest.mark.timeout(240)
def test_a_finished_jobs_exported_model_is_listed_and_downloaded(
    stage: Stage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a short digits job that exports its model at the end
    spec = digits_spec(steps=60, checkpoint_every=30)
    spec["command"] = [*spec["command"], "--export"]
    job_id = stage.submit(spec)

    # when it succeeds
    job = stage.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=150)
    assert job.state is JobState.SUCCEEDED, job.status_detail
    capsys.readouterr()

    # then the user finds the model among its outputs, and downloads it
    with mock.patch.dict(os.environ, stage.cloud.exports()):
        assert gpujobs_cli(["artifacts", job_id, "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert gpujobs_cli(["download", job_id, str(tmp_path / "results")]) == 0

    assert [a["key"] for a in listed] == ["model.safetensors"]
    bucket = stage.cloud.outputs["CheckpointBucketName"]
    assert listed[0]["uri"] == f"s3://{bucket}/outputs/{job.team}/{job_id}/model.safetensors"
    weights = load_file(tmp_path / "results" / "model.safetensors")
    assert weights, "the downloaded file holds the model's tensors"
    assert all(not name.startswith("module.") for name in weights)
    assert (tmp_path / "results" / "model.safetensors").stat().st_size == listed[0]["size"]
