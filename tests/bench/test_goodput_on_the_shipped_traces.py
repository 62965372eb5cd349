"""The README's claims about the shipped spot traces, kept true (skipped where the traces are absent).

The traces live beside the repository (`../shared/data/spot-traces`, see the README);
`GPUJOBS_SPOT_TRACES` points elsewhere.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from bench.replay.model import Params, Result
from bench.replay.suite import run_all
from bench.replay.traces import load_trace_sets

ROOT = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("GPUJOBS_SPOT_TRACES", ROOT.parent / "shared" / "data" / "spot-traces"))


@pytest.mark.slow
@pytest.mark.skipif(not TRACES.is_dir(), reason=f"no spot traces at {TRACES}")
def test_gpujobs_finishes_above_the_anchors_and_its_spot_job_is_the_cheapest_on_every_shipped_folder():
    """Issue 21: the spot-first job finishes with goodput >= 0.95, above both anchors; the same job
    with `capacity: spot` (the anchors' market) loses no step and costs the least of them."""
    results = run_all(load_trace_sets(TRACES), Params())
    by_folder: dict[str, dict[str, Result]] = {}
    for result in results:
        by_folder.setdefault(Path(result.traces).name, {})[result.strategy] = result
    assert set(by_folder) == {"aws-02-15-2023", "aws-04-22-2023"}
    for folder, rows in by_folder.items():
        ours, spot, anchors = rows["gpujobs"], rows["gpujobs (spot)"], [rows["skypilot-like"], rows["sagemaker-like"]]
        assert ours.hours_to_finish is not None, folder
        assert ours.goodput >= 0.95, folder
        assert all(ours.goodput > a.goodput for a in anchors), folder
        assert ours.cost_per_useful_gpu_hour is not None
        assert ours.cost_per_useful_gpu_hour < rows["on-demand"].cost_per_useful_gpu_hour  # type: ignore[operator]
        assert spot.steps_lost == 0, folder
        assert all(spot.goodput > a.goodput for a in anchors), folder
        assert all(spot.cost_per_useful_gpu_hour < a.cost_per_useful_gpu_hour for a in anchors), folder  # type: ignore[operator]
    assert by_folder["aws-02-15-2023"]["gpujobs (spot)"].goodput >= 0.97


@pytest.mark.slow
@pytest.mark.skipif(not TRACES.is_dir(), reason=f"no spot traces at {TRACES}")
@pytest.mark.parametrize("deadline_hours", [50.0, 52.0, 60.0])
def test_gpujobs_meets_every_deadline_on_demand_meets_at_no_more_than_uniform_progress(deadline_hours: float):
    results = run_all(load_trace_sets(TRACES), dataclasses.replace(Params(), deadline_hours=deadline_hours))
    by_folder: dict[str, dict[str, Result]] = {}
    for result in results:
        by_folder.setdefault(Path(result.traces).name, {})[result.strategy] = result
    for folder, rows in by_folder.items():
        ours, up = rows["gpujobs"], rows["uniform-progress"]
        assert rows["on-demand"].met_deadline is True, folder
        assert ours.met_deadline is True, folder
        assert ours.cost_per_useful_gpu_hour is not None
        assert up.cost_per_useful_gpu_hour is not None
        assert ours.cost_per_useful_gpu_hour <= up.cost_per_useful_gpu_hour, folder
