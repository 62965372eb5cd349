"""`bench/goodput.py` reads any folder in the documented format, and names the file it cannot read."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.goodput import main
from bench.replay.model import Gang, Params
from bench.replay.traces import TraceError, load_trace_sets
from tests.bench.conftest import write_trace, write_zones


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_folder_of_traces_is_one_set_of_zones_with_a_row_per_strategy(tmp_path, capsys):
    write_zones(tmp_path / "east" / "week-1")
    write_zones(tmp_path / "west")
    (tmp_path / "README.md").write_text("not a trace")
    out = run_json(capsys, "--traces", str(tmp_path), "--hours-of-work", "2")
    rows = out["results"]
    assert [(Path(r["traces"]).name, r["strategy"]) for r in rows] == [
        (folder, strategy)
        for folder in ("week-1", "west")
        for strategy in ("gpujobs", "gpujobs (spot)", "skypilot-like", "sagemaker-like", "on-demand")
    ]
    assert set(rows[0]) >= {
        "traces", "strategy", "goodput", "cost_per_useful_gpu_hour", "hours_to_finish", "steps_lost",
        "interruptions", "met_deadline",
    }  # fmt: skip
    assert all(r["met_deadline"] is None for r in rows)
    params = out["params"]
    assert (params["boot_s"], params["spot_usd_per_hour"], params["on_demand_usd_per_hour"]) == (480.0, 0.918, 3.06)


def test_a_deadline_adds_uniform_progress_and_says_who_met_it(tmp_path, capsys):
    write_zones(tmp_path)
    out = run_json(capsys, "--traces", str(tmp_path), "--hours-of-work", "2", "--deadline-hours", "2.4")
    met = {r["strategy"]: r["met_deadline"] for r in out["results"]}
    assert met == {
        "gpujobs": True,
        "skypilot-like": False,
        "sagemaker-like": False,
        "on-demand": True,
        "uniform-progress": True,
    }


def test_counts_above_one_are_gangs_of_up_to_that_many_nodes(tmp_path, capsys):
    write_zones(tmp_path, per_node=4)
    out = run_json(capsys, "--traces", str(tmp_path), "--hours-of-work", "2", "--nodes", "4")
    assert {r["strategy"]: r["hours_to_finish"] is not None for r in out["results"]} == dict.fromkeys(
        ("gpujobs", "gpujobs (spot)", "skypilot-like", "sagemaker-like", "on-demand"), True
    )
    too_big = run_json(capsys, "--traces", str(tmp_path), "--hours-of-work", "2", "--nodes", "5")
    unfinished = {r["strategy"] for r in too_big["results"] if r["hours_to_finish"] is None}
    # never spot room for 5: the spot strategies wait; spot-first and on-demand (not traced) finish
    assert unfinished == {"gpujobs (spot)", "skypilot-like", "sagemaker-like"}


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ("{not json", "not a readable JSON document"),
        (json.dumps([0, 1]), "expected an object"),
        (json.dumps({"data": [1, 0]}), "metadata.gap_seconds must be a positive number"),
        (json.dumps({"metadata": {"gap_seconds": 0}, "data": [1]}), "metadata.gap_seconds must be a positive number"),
        (json.dumps({"metadata": {"gap_seconds": 60}, "data": []}), "data must be a non-empty list"),
        (json.dumps({"metadata": {"gap_seconds": 60}, "data": [1, -1]}), "data[1] is -1"),
        (json.dumps({"metadata": {"gap_seconds": 60}, "data": [1, True]}), "data[1] is True"),
        (json.dumps({"metadata": {"gap_seconds": 60}, "data": [1, 0.5]}), "data[1] is 0.5"),
    ],
)
def test_a_malformed_trace_is_refused_with_its_file_named(tmp_path, capsys, document, problem):
    write_zones(tmp_path / "zones")
    broken = tmp_path / "zones" / "us-east-1z_v100_1.json"
    broken.write_text(document)
    assert main(["--traces", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert str(broken) in error
    assert problem in error
    with pytest.raises(TraceError) as raised:
        load_trace_sets(tmp_path)
    assert raised.value.path == broken


def test_a_folder_without_traces_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("no traces here")
    assert main(["--traces", str(tmp_path)]) == 2
    assert f"{tmp_path}: holds no *.json trace file" in capsys.readouterr().err


def test_a_pool_answers_when_a_gang_fits_and_when_it_is_reclaimed(tmp_path):
    write_trace(tmp_path / "z.json", [2, 2, 1, 0, 2, 3], gap=10)
    ((pool,),) = (s.pools for s in load_trace_sets(tmp_path))
    assert (pool.next_drop(0, nodes=2), pool.next_drop(0, nodes=1), pool.next_drop(45, nodes=2)) == (20, 30, None)
    assert (pool.next_fit(21, nodes=2), pool.next_fit(21, nodes=1), pool.next_fit(21, nodes=4)) == (40, 21, None)
    assert pool.end == 60
    assert pool.capacity(60) == 0  # nothing is known after the trace


@pytest.mark.parametrize("work", [1.0, 1799.0, 1800.0, 1800.5, 3600.0, 7199.9, 48 * 3600.0])
def test_the_workload_finishes_exactly_when_its_progress_reaches_the_work(work):
    gang = Gang.launch(Params(save_stall_s=7.0), at=100.0, resume_from=0.0)
    assert gang.progress_at(gang.finish_at(work)) == pytest.approx(work)
    assert gang.progress_at(gang.finish_at(work) - 1) < work
    assert math.isinf(gang.stopped_at)


def test_a_job_the_control_plane_rejects_stops_the_run_with_its_reason(tmp_path, capsys):
    write_zones(tmp_path, per_node=100)
    assert main(["--traces", str(tmp_path), "--nodes", "65"]) == 2
    assert (
        "the control plane rejected the job: nodes: Input should be less than or equal to 64" in capsys.readouterr().err
    )
