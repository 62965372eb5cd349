"""The README's main command: a job survives a spot interruption on the local cloud, end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpujobs_local.demo import CHECKPOINT_EVERY_STEPS, main
from tests.warning_saves import warning_saves_problem

pytestmark = [pytest.mark.integration, pytest.mark.training, pytest.mark.slow]


def _commits(summary: dict[str, Any], *, attempt: int) -> list[tuple[int, str]]:
    return [(c["step"], c["reason"]) for c in summary["checkpoints"] if c["attempt"] == attempt]


@pytest.mark.timeout(300)
def test_the_demo_job_survives_a_spot_interruption_and_finishes_accurate(
    restored_environ: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--json", "--workdir", str(tmp_path)])

    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["final_state"] == "SUCCEEDED"
    assert summary["accuracy"] >= 0.9
    first, second = summary["attempts"]
    assert first["end_reason"] == "interrupted"
    assert (second["instance_type"], second["zone"]) != (first["instance_type"], first["zone"])
    assert second["start_step"] == first["end_step"]  # resumed exactly from attempt 1's newest checkpoint
    assert first["end_step"] in summary["checkpoint_steps"]
    # the warning (checkpoint-now over SSM, the IMDS notice, SIGTERM) saved once, or joined the save just made
    commits = _commits(summary, attempt=1)
    assert warning_saves_problem(commits, first["end_step"]) is None
    saved_at_the_warning = (first["end_step"], "preempted") in commits or (first["end_step"], "on-demand") in commits
    # a save at the warning loses at most the step in flight; a joined save, what ran since it started
    assert summary["steps_lost"] <= (1 if saved_at_the_warning else CHECKPOINT_EVERY_STEPS - 1)
    assert summary["logs"]["log_group"] == "/gpujobs/gpujobs-local/jobs"
    assert summary["logs"]["streams"] == [f"demo/{summary['job_id']}/{a['attempt']}/0" for a in (first, second)]
    instance_logs = list(tmp_path.rglob("bootstrap.log"))
    assert len(instance_logs) == 2  # two instances ran, nothing else was launched
    assert summary["outputs"]["uri"] == f"s3://gpujobs-local-checkpoints/outputs/demo/{summary['job_id']}/"
    assert summary["outputs"]["keys"] == ["model.safetensors"]  # the finishing attempt's run.export(model)


@pytest.mark.timeout(300)
def test_the_two_node_demo_replaces_only_the_reclaimed_node_from_one_warning_save(
    restored_environ: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21: the survivor stays up and regroups with the reclaimed node's replacement, in the same
    attempt, from the warning's checkpoint. Each node gets the control plane's checkpoint-now at its own
    moment and only the reclaimed one sees the notice: they used to commit a save each (steps 196, 197
    and 198 in a row); they commit one."""
    code = main(["--json", "--workdir", str(tmp_path), "--nodes", "2"])

    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["final_state"] == "SUCCEEDED"
    assert summary["accuracy"] >= 0.9
    (only,) = summary["attempts"]
    regroup = summary["regroup"]
    assert only["generation"] == regroup["generation"] == 1
    assert only["left"] == regroup["lost"]
    assert only["instances"] == [*regroup["survivors"], regroup["replacement"]]  # two nodes, as before
    resumed = regroup["resumed_step"]
    before = [(step, why) for step, why in _commits(summary, attempt=1) if step <= resumed]
    assert warning_saves_problem(before, resumed) is None  # resumed from the one save the warning made
    assert summary["steps_lost"] <= CHECKPOINT_EVERY_STEPS - 1
    assert len(list(tmp_path.rglob("bootstrap.log"))) == 3  # two launched, one replacement: nothing else
