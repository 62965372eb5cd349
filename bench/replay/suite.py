"""Every strategy on every trace set, all on the same traces, workload and prices."""

from __future__ import annotations

from collections.abc import Callable

from .anchors import on_demand, sagemaker_like, skypilot_like, uniform_progress
from .control_plane import gpujobs
from .model import Params, Result
from .traces import TraceSet

Strategy = Callable[[TraceSet, Params], Result]

STRATEGIES: dict[str, Strategy] = {
    "gpujobs": gpujobs,
    "skypilot-like": skypilot_like,
    "sagemaker-like": sagemaker_like,
    "on-demand": on_demand,
    "uniform-progress": uniform_progress,
}
"""Row order of the results; `uniform-progress` runs only with a deadline (it is a deadline policy)."""


def run_all(trace_sets: list[TraceSet], params: Params) -> list[Result]:
    return [
        strategy(traces, params)
        for traces in trace_sets
        for name, strategy in STRATEGIES.items()
        if name != "uniform-progress" or params.deadline_hours is not None
    ]
