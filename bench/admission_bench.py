"""The admission decision at scale: one reconciler tick's plan with 10,000 queued jobs of 50 teams.

The real `domain.admission.plan` decides on records built as the store holds them: 50 teams with
quotas, weights and borrowing, a capped fleet half full of running jobs (some borrowed), and
10,000 waiting jobs of every priority, some aged. What is measured is our own CPU time on this
machine for the decision (the ledger read and the listing are the tick's, counted by
`reconciler_tick_bench.py`), against the 1 s of the 120 s tick it may take (issue 20's target), and,
for the CLI, the queue view (`gpujobs queue`: the plan plus its latest-start estimate).

Run: `python bench/admission_bench.py [--queued 10000] [--teams 50] [--repeat 5] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "layers" / "gpujobs")]

from gpujobs.domain.admission import plan  # noqa: E402
from gpujobs.domain.job import Admission, Attempt, Job  # noqa: E402
from gpujobs.domain.ledger import truth  # noqa: E402
from gpujobs.domain.queue_view import places  # noqa: E402
from gpujobs.domain.spec import validate_spec  # noqa: E402
from gpujobs.domain.states import JobState  # noqa: E402
from gpujobs.domain.teams import TeamDirectory, parse_team_config  # noqa: E402

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TARGET_SECONDS = 1.0
"""Of the reconciler's 120 s tick, what the admission decision may take (issue 20)."""


def fleet(teams: int) -> TeamDirectory:
    config = {
        f"team-{t:02d}": {
            "principals": ["AROAEXAMPLEID1234567"],
            "gpus": 64,
            "weight": 1 + t % 4,
            "borrow": t % 3 == 0,
        }
        for t in range(teams)
    }
    return parse_team_config(json.dumps({"teams": config, "fleet": {"max_gpus": 32 * teams}}))


def jobs(queued: int, teams: int) -> tuple[list[Job], list[Job]]:
    specs = [
        validate_spec(
            {
                "name": f"j{n}",
                "image": "img:1",
                "command": ["python", "train.py"],
                "instance_types": ["p4d.24xlarge"],
                "gpus_per_node": 8,
                "nodes": 1 + n % 2,
                "team": f"team-{n % teams:02d}",
                "priority": ("low", "normal", "high")[n % 3],
            }
        )
        for n in range(max(queued, teams * 2))
    ]
    waiting = [
        Job.submitted(job_id=f"j-{n:016x}", spec=specs[n], now=NOW - timedelta(minutes=n % 900), message_id=None)
        for n in range(queued)
    ]
    running = []
    for t in range(teams):  # half the fleet's cap in use: 16 GPUs a team, some borrowed
        job = Job.submitted(job_id=f"j-{queued + t:016x}", spec=specs[t], now=NOW - timedelta(hours=2), message_id=None)
        attempt = Attempt(number=1, started_at=NOW - timedelta(hours=1), instance_ids=(f"i-{t}",))
        admission = Admission(at=NOW - timedelta(hours=1), borrowed=8 if t % 3 == 0 else 0)
        running.append(
            job.model_copy(update={"state": JobState.RUNNING, "admission": admission, "attempts": (attempt,)})
        )
    return waiting, running


def measure(queued: int, teams: int, repeat: int) -> dict[str, Any]:
    directory = fleet(teams)
    waiting, running = jobs(queued, teams)
    ledger = truth([*waiting, *running])
    decide, view = [], []
    decided = None
    for _ in range(repeat):
        started = time.perf_counter()
        decided = plan(waiting, running, ledger, directory, NOW)
        decide.append(time.perf_counter() - started)
    started = time.perf_counter()
    shown = places(waiting, running, directory, NOW)
    view.append(time.perf_counter() - started)
    assert decided is not None
    median = statistics.median(decide)
    return {
        "queued_jobs": queued,
        "teams": teams,
        "admitted": len(decided.admit),
        "preempted": len(decided.preempt),
        "plan_seconds_median": round(median, 4),
        "plan_seconds_max": round(max(decide), 4),
        "share_of_target": round(median / TARGET_SECONDS, 3),
        "queue_view_seconds": round(view[0], 3),
        "queue_places": len(shown),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--teams", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(n, args.teams, args.repeat) for n in args.queued]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        print(
            f"{r['queued_jobs']:>6} queued, {r['teams']} teams: plan {r['plan_seconds_median']:.3f} s median "
            f"(max {r['plan_seconds_max']:.3f} s; {r['share_of_target']:.2f} of the 1 s target), "
            f"{r['admitted']} admitted, {r['preempted']} preempted; gpujobs queue's view {r['queue_view_seconds']:.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
