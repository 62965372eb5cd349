"""With `--deadline-hours`, the `gpujobs` row is the control plane keeping the spec's deadline.

One zone, ticks of 10 minutes, the conftest's job (2 h of work, a 10-minute boot, a 1-minute
restore, checkpoints every 30 minutes). The control plane's changeover is its own allowance
(8 + 1 + 30 = 39 min, `domain.deadline`), not the bench's boot.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.replay.anchors import on_demand
from bench.replay.control_plane import ControlPlaneReplay
from bench.replay.model import Params
from bench.replay.traces import TraceSet, load_trace_sets
from gpujobs.domain.job import Market
from gpujobs.domain.states import JobState, Reason
from tests.bench.conftest import TICKS, write_trace


def one_zone(tmp_path: Path, counts: list[int]) -> TraceSet:
    write_trace(tmp_path / "one-zone" / "a.json", counts)
    (traces,) = load_trace_sets(tmp_path / "one-zone")
    return traces


def test_spot_while_the_slack_allows_then_on_demand_in_time(tmp_path: Path, params: Params) -> None:
    # Room for the first hour only. Due at 240 min: the job starts on spot (81 min of slack),
    # is warned at 58 min with 48 min of work saved, waits for spot (nothing to pay), and goes
    # on-demand once 72 min of work and two changeovers (78 min) fill what is left: at 90 min.
    traces = one_zone(tmp_path, [1] * 6 + [0] * (TICKS - 6))
    with_deadline = dataclasses.replace(params, deadline_hours=4.0)
    replay = ControlPlaneReplay(traces, with_deadline)
    result = replay.replay()

    assert result.met_deadline is True
    assert on_demand(traces, with_deadline).met_deadline is True
    job = replay.job
    assert job.state is JobState.SUCCEEDED
    launched = [(fake.request.market, fake.launched_at) for fake in replay.compute.instances.values()]
    assert [market for market, _ in launched] == [Market.SPOT, Market.ON_DEMAND]
    waited_until = (launched[-1][1] - job.created_at).total_seconds() / 60
    assert waited_until == 90  # the backoff never ran past the moment on-demand was needed
    assert result.steps_lost == 0


def test_an_on_demand_attempt_well_ahead_of_schedule_moves_back_to_spot(tmp_path: Path, params: Params) -> None:
    # No spot room for the first 30 min and 6 h to do 2 h of work: at the first retry the job is
    # behind uniform progress, so spot-first launches on-demand. Training from 11 min, it is two
    # changeovers ahead of schedule by about 56 min; the reconciler checkpoints it and moves it to
    # spot, where it finishes. It is the control plane's doing: the record says why.
    traces = one_zone(tmp_path, [0] * 3 + [1] * (TICKS - 3))
    with_deadline = dataclasses.replace(params, deadline_hours=6.0)
    replay = ControlPlaneReplay(traces, with_deadline)
    result = replay.replay()

    job = replay.job
    assert job.state is JobState.SUCCEEDED
    assert [a.market for a in job.attempts if a.instance_ids] == [Market.ON_DEMAND, Market.SPOT]
    moved = [h for h in job.history if h.reason is Reason.DEADLINE_MARKET]
    assert len(moved) == 1
    assert 55 <= (moved[0].at - job.created_at).total_seconds() / 60 <= 58
    assert "move to spot" in moved[0].detail
    assert job.interruptions == 0
    assert result.met_deadline is True
    assert result.cost_usd < on_demand(traces, with_deadline).cost_usd
