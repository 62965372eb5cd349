"""Spot capacity traces: one file per zone, one folder per set of zones a job may use.

The format is the one of skypilot-org/spot-traces (shared/data/spot-traces/README.md):
`{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}`, where `data[i]` is how many spot
instances were obtainable from `i * G` to `(i + 1) * G` seconds after the trace's start. A gang of
N nodes can run while the count is at least N, so every question here takes `nodes`. A 1 -> 0 step
is a reclaim; the trace says nothing after its last tick, so a replay ends there.

A malformed file is refused with a `TraceError` naming it: a benchmark that quietly read a broken
trace as "no capacity" would report numbers about nothing.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


class TraceError(ValueError):
    """A trace file that does not follow the documented format."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path


@dataclass(frozen=True)
class Pool:
    """One zone's spot capacity over time, as a trace recorded it."""

    name: str
    gap_seconds: float
    counts: tuple[int, ...]
    _changes: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def end(self) -> float:
        """Seconds from the start to the end of the last tick: nothing is known after it."""
        return len(self.counts) * self.gap_seconds

    def tick(self, t: float) -> int:
        return int(t // self.gap_seconds)

    def capacity(self, t: float) -> int:
        """Instances obtainable at `t` seconds (0 outside the trace)."""
        i = self.tick(t)
        return self.counts[i] if 0 <= i < len(self.counts) else 0

    def _boundaries(self, nodes: int) -> tuple[list[int], list[int]]:
        """The ticks where a gang of `nodes` starts to fit, and where it stops fitting."""
        if nodes not in self._changes:
            ups, downs = [], []
            fits_before = False
            for i, count in enumerate(self.counts):
                fits = count >= nodes
                if fits and not fits_before:
                    ups.append(i)
                elif fits_before and not fits:
                    downs.append(i)
                fits_before = fits
            self._changes[nodes] = (ups, downs)
        return self._changes[nodes]

    def next_drop(self, t: float, *, nodes: int) -> float | None:
        """When a gang of `nodes` running at `t` is reclaimed: the next tick without room for it
        (None when it still fits at the end of the trace)."""
        downs = self._boundaries(nodes)[1]
        k = bisect.bisect_right(downs, self.tick(t))
        return downs[k] * self.gap_seconds if k < len(downs) else None

    def next_fit(self, t: float, *, nodes: int) -> float | None:
        """The first moment at or after `t` when a gang of `nodes` fits (None: not in this trace)."""
        if t >= self.end:
            return None
        if self.capacity(t) >= nodes:
            return t
        ups = self._boundaries(nodes)[0]
        k = bisect.bisect_right(ups, self.tick(t))
        return ups[k] * self.gap_seconds if k < len(ups) else None

    def availability(self, *, nodes: int) -> float:
        return sum(1 for c in self.counts if c >= nodes) / len(self.counts)


@dataclass(frozen=True)
class TraceSet:
    """The zones of one folder: the pools a job may use, in file-name order."""

    folder: Path
    pools: tuple[Pool, ...]

    @property
    def end(self) -> float:
        return max(p.end for p in self.pools)

    def first_fit(self, t: float, *, nodes: int, order: Sequence[Pool] | None = None) -> Pool | None:
        """The first pool, in `order` (default: file order), where a gang fits at `t`."""
        return next((p for p in (order or self.pools) if p.capacity(t) >= nodes), None)


def load_pool(path: Path) -> Pool:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(path, f"not a readable JSON document ({exc})") from exc
    if not isinstance(document, dict):
        raise TraceError(path, "expected an object with `metadata` and `data`")
    metadata = document.get("metadata")
    gap = metadata.get("gap_seconds") if isinstance(metadata, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not math.isfinite(gap) or gap <= 0:
        raise TraceError(path, "metadata.gap_seconds must be a positive number")
    data = document.get("data")
    if not isinstance(data, list) or not data:
        raise TraceError(path, "data must be a non-empty list of instance counts")
    bad = next((i for i, n in enumerate(data) if isinstance(n, bool) or not isinstance(n, int) or n < 0), None)
    if bad is not None:
        raise TraceError(path, f"data[{bad}] is {data[bad]!r}, not a count of instances (an integer >= 0)")
    return Pool(name=path.stem, gap_seconds=float(gap), counts=tuple(data))


def load_trace_sets(root: Path) -> list[TraceSet]:
    """Every folder under `root` (itself included) that holds `*.json` traces, one set per folder."""
    if not root.is_dir():
        raise TraceError(root, "not a folder of traces")
    folders = sorted({p.parent for p in root.rglob("*.json")})
    if not folders:
        raise TraceError(root, "holds no *.json trace file")
    return [TraceSet(folder, tuple(load_pool(p) for p in sorted(folder.glob("*.json")))) for folder in folders]
