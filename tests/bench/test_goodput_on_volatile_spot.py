"""Issue 21: on spot that reclaims every hour in every zone at once, the `spot` job fails at its
101st interruption, and the `spot-first` job (the default) finishes: spot's volatility sends it to
on-demand (`domain.volatility`), its tries of spot back off, and goodput stays above 0.95.

The trace is made by hand and is not fitted to anything: two zones of ten-minute ticks that drop
together (a replacement finds no room in the other zone) for ten minutes in every seventy, so a
gang launched in the last minutes before a drop is warned at launch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.replay.anchors import sagemaker_like, skypilot_like
from bench.replay.control_plane import ControlPlaneReplay
from bench.replay.model import Params
from bench.replay.traces import TraceSet, load_trace_sets
from gpujobs.domain.job import Market
from gpujobs.domain.states import JobState, Reason
from tests.bench.conftest import write_trace

HOURS = 150.0
TICKS = 6 * 240  # ten days of ten-minute ticks


def blinking(tmp_path: Path) -> TraceSet:
    counts = ([1] * 6 + [0]) * (TICKS // 7)
    for zone in ("a", "b"):
        write_trace(tmp_path / "blinking" / f"{zone}.json", counts)
    (traces,) = load_trace_sets(tmp_path / "blinking")
    return traces


def test_the_spot_job_fails_at_its_101st_interruption_and_the_spot_first_job_finishes(
    tmp_path: Path, params: Params
) -> None:
    traces, long = blinking(tmp_path), dataclasses.replace(params, hours_of_work=HOURS)

    spot = ControlPlaneReplay(traces, long, capacity="spot")
    spot_result = spot.replay()
    assert spot.job.state is JobState.FAILED
    assert spot.job.history[-1].reason is Reason.INTERRUPTED_TOO_OFTEN
    assert spot_result.hours_to_finish is None

    first = ControlPlaneReplay(traces, long)
    result = first.replay()
    job = first.job
    assert job.state is JobState.SUCCEEDED
    assert not any(e.target is JobState.FAILED for e in job.history)
    assert result.goodput >= 0.95
    assert result.goodput > skypilot_like(traces, long).goodput
    assert result.goodput > sagemaker_like(traces, long).goodput
    markets = {fake.request.market for fake in first.compute.instances.values()}
    assert markets == {Market.SPOT, Market.ON_DEMAND}  # it tried spot again, and did not stay there
    assert result.interruptions < 30  # the backoff: a handful of tries of spot, not one an hour


def test_a_gang_launched_minutes_before_its_pool_drops_is_warned_at_launch(tmp_path: Path, params: Params) -> None:
    """The failure model: the trace says a pool has room until its next tick, so a gang launched in
    the last two minutes before a drop gets the warning at launch and is reclaimed at the drop,
    paid for those minutes; its replacement goes to the other zone."""
    write_trace(tmp_path / "edge" / "a.json", [1] + [0] * 599, gap=60)  # room for the first minute only
    write_trace(tmp_path / "edge" / "b.json", [0] + [1] * 599, gap=60)
    (traces,) = load_trace_sets(tmp_path / "edge")
    replay = ControlPlaneReplay(traces, dataclasses.replace(params, hours_of_work=0.5), capacity="spot")
    replay.replay()
    first, *rest = replay.runs.values()
    assert (first.pool.name, first.launched_at, first.warned_at, first.ends_by) == ("a", 0.0, 0.0, 60.0)
    assert first.gang is None  # reclaimed before it booted: paid one minute, trained nothing
    assert [run.pool.name for run in rest] == ["b"]  # the replacement, once b has room
    assert replay.job.state is JobState.SUCCEEDED
    assert replay.job.interruptions == 1
