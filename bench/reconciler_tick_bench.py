"""The reconciler's tick at scale: how long one run takes with thousands of running jobs.

The real `Reconciler` runs over the in-memory fakes, each port call charged to the fake clock at a
typical in-Region latency (`LATENCY`: DynamoDB single-digit ms per item call, a BatchGetItem of 100
records about 40 ms, a 1 MB query page per 100 records, DescribeInstances pages of 1,000, alarms
pages of 100). The result is the tick's simulated duration against its 120 s Lambda timeout and
the calls it made, so the figures do not depend on this machine's load; only the model's latencies
are assumptions, and every call is counted so another latency model can be applied to the counts.

Scenarios, per fleet size: a quiet tick (every job healthy), and one where 1% of the jobs hung
before their first heartbeat long ago (the repair that matters most: they must be reached).

Run: `python bench/reconciler_tick_bench.py [--jobs 5000 10000] [--json]` (about 3 min: the fleets
are submitted through the real submit path first).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "layers" / "gpujobs"), str(ROOT / "fakes")]

from gpujobs.domain.job import Job  # noqa: E402
from gpujobs.service.config import LaunchConfig  # noqa: E402
from gpujobs.service.repairs import Repair  # noqa: E402
from gpujobs_fakes.memory import FakeCompute, FixedClock, InMemoryIdleAlarms, InMemoryJobStore  # noqa: E402
from gpujobs_fakes.wiring import fake_ports, wire  # noqa: E402

TIMEOUT = timedelta(seconds=120)
"""The ReconcilerFunction's Timeout (template.yaml)."""


def per(size: int, seconds: float) -> Callable[[Any], float]:
    """`seconds` for every `size` items of the call's result (at least one page)."""

    def cost(result: Any) -> float:
        return max(1, -(-len(result or ()) // size)) * seconds

    return cost


LATENCY: dict[str, dict[str, float | Callable[[Any], float]]] = {
    "store": {
        "get": 0.005,
        "get_many": per(100, 0.040),
        "save": 0.015,
        "create": 0.010,
        "find_by_instance": 0.010,
        "list_by_state": per(100, 0.030),
        "ledger": 0.005,
    },
    "compute": {"list_instances": per(1000, 0.400), "find_instances": 0.150, "terminate": 0.200},
    "alarms": {"states": per(100, 0.060), "create": 0.050, "delete": 0.050},
    "budgets": {"policy_for": 0.005, "policies": 0.010},
    "publisher": {"publish": 0.020, "publish_notice": 0.020},
}


class Charged:
    """A port whose calls cost the fake clock what `costs` says, and are counted."""

    def __init__(self, name: str, target: Any, clock: FixedClock, calls: Counter[str]) -> None:
        self._name, self._target, self._clock, self._calls = name, target, clock, calls

    def __getattr__(self, method: str) -> Any:
        inner = getattr(self._target, method)
        cost = LATENCY[self._name].get(method)
        if not callable(inner) or cost is None:
            return inner

        def call(*args: Any, **kwargs: Any) -> Any:
            result = inner(*args, **kwargs)
            self._calls[f"{self._name}.{method}"] += 1
            seconds = cost(result) if callable(cost) else cost
            self._clock.current += timedelta(seconds=seconds)
            return result

        return call


def fleet(jobs: int, hung_share: float) -> tuple[Any, Counter[str], FixedClock, list[Job]]:
    """`jobs` RUNNING GPU jobs; the first `hung_share` of them launched long ago and never reported."""
    clock = FixedClock()
    store, compute, alarms = InMemoryJobStore(), FakeCompute(clock=clock), InMemoryIdleAlarms()
    ports = fake_ports(store=store, clock=clock, compute=compute, alarms=alarms)
    config = LaunchConfig(
        checkpoint_bucket="bench", event_bus_name="bench", region="us-east-1", allowed_instance_types=("g5.xlarge",)
    )
    services = wire(ports, config)
    spec = {"name": "tick", "image": "train:1", "command": ["python", "train.py"], "instance_types": ["g5.xlarge"]}
    hung_count = int(jobs * hung_share)
    launched: list[Job] = []
    for n in range(jobs):
        if n == hung_count:
            clock.current += timedelta(hours=2)  # the hung ones are past any first-heartbeat limit
        launched.append(services.jobs.handle_message(json.dumps(spec), message_id=f"m-{n}").job)
    calls: Counter[str] = Counter()
    store.stream.reads_on_write = False  # the Publisher function reads the table's stream, not the tick
    charged: dict[str, Any] = {name: Charged(name, getattr(ports, name), clock, calls) for name in LATENCY}
    timed = wire(dataclasses.replace(ports, **charged), config)
    return timed.reconciler, calls, clock, launched[:hung_count]


def tick(jobs: int, hung_share: float) -> dict[str, Any]:
    reconciler, calls, clock, hung = fleet(jobs, hung_share)
    start = clock.current
    wall = time.perf_counter()
    report = reconciler.run(deadline=start + TIMEOUT)
    wall = time.perf_counter() - wall
    took = (clock.current - start).total_seconds()
    return {
        "running_jobs": jobs,
        "hung_jobs": len(hung),
        "tick_seconds": round(took, 1),
        "share_of_timeout": round(took / TIMEOUT.total_seconds(), 2),
        "jobs_listed": report.active_jobs,
        "hung_terminated": report.repairs[Repair.HUNG_ATTEMPTS_TERMINATED],
        "deferred": report.repairs[Repair.RUNNING_REPAIRS_DEFERRED_TO_THE_NEXT_RUN],
        "store_calls": {k.split(".", 1)[1]: v for k, v in sorted(calls.items()) if k.startswith("store.")},
        "our_cpu_seconds": round(wall, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[5000, 10000])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # each hung job's termination is logged; the counts say it
    results = [tick(n, share) for n in args.jobs for share in (0.0, 0.01)]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        print(
            f"{r['running_jobs']:>6} running, {r['hung_jobs']:>3} hung: tick {r['tick_seconds']:>6.1f} s "
            f"({r['share_of_timeout']:.2f} of the timeout), listed {r['jobs_listed']}, "
            f"hung terminated {r['hung_terminated']}, deferred {r['deferred']}, store calls {r['store_calls']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
