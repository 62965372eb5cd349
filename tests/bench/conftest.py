"""A hand-made pair of zones, small enough that every strategy's figures can be worked out by hand.

Ticks of 10 minutes, 10 hours long. Zone `a` has room from the start, loses it at 60 min and gets
it back at 120 min; zone `b` has room from 30 min on. The time costs are round numbers: a 10-minute
boot, a 1-minute restore, saves that never stall and commit in 12 s, a checkpoint every 30 minutes,
spot at $1 and on-demand at $3 an hour, one job of 2 hours of work.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.replay.model import Params
from bench.replay.traces import TraceSet, load_trace_sets

TICK_S = 600
TICKS = 60


def write_trace(path: Path, counts: list[int], *, gap: float = TICK_S) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": counts}))
    return path


def zone_counts(per_node: int = 1) -> dict[str, list[int]]:
    a = [1] * 6 + [0] * 6 + [1] * (TICKS - 12)
    b = [0] * 3 + [1] * (TICKS - 3)
    return {"a": [n * per_node for n in a], "b": [n * per_node for n in b]}


def write_zones(folder: Path, *, per_node: int = 1) -> Path:
    for name, counts in zone_counts(per_node).items():
        write_trace(folder / f"{name}.json", counts)
    return folder


@pytest.fixture
def params() -> Params:
    return Params(
        hours_of_work=2.0,
        boot_s=600.0,
        restore_s=60.0,
        save_stall_s=0.0,
        save_commit_s=12.0,
        checkpoint_every_minutes=30,
        spot_usd_per_hour=1.0,
        on_demand_usd_per_hour=3.0,
    )


@pytest.fixture
def two_zones(tmp_path: Path) -> TraceSet:
    (traces,) = load_trace_sets(write_zones(tmp_path / "two-zones"))
    return traces
