"""Every strategy on every trace set, all on the same traces, workload and prices."""

from __future__ import annotations

from collections.abc import Callable

from .anchors import on_demand, sagemaker_like, skypilot_like, uniform_progress
from .control_plane import gpujobs, gpujobs_spot
from .model import Params, Result
from .traces import TraceSet

Strategy = Callable[[TraceSet, Params], Result]

STRATEGIES: dict[str, Strategy] = {
    "gpujobs": gpujobs,
    "gpujobs (spot)": gpujobs_spot,
    "skypilot-like": skypilot_like,
    "sagemaker-like": sagemaker_like,
    "on-demand": on_demand,
    "uniform-progress": uniform_progress,
}
"""Row order of the results. `uniform-progress` runs only with a deadline (it is a deadline policy);
`gpujobs (spot)` only without one (a deadline needs `spot-first`)."""


def run_all(trace_sets: list[TraceSet], params: Params) -> list[Result]:
    deadline = params.deadline_hours is not None
    skip = {"gpujobs (spot)"} if deadline else {"uniform-progress"}
    return [
        strategy(traces, params) for traces in trace_sets for name, strategy in STRATEGIES.items() if name not in skip
    ]
