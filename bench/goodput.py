"""Goodput on real spot traces: one job under each strategy, on the same traces, at simulated time.

Every folder under `--traces` that holds `*.json` traces (shared/data/spot-traces/README.md gives the
format) is one set of zones a job may use, each file one zone's spot pool. On each set, one job of
`--hours-of-work` hours of gang work runs under every strategy: `gpujobs` (the real service layer on
in-memory fakes, EC2 following the traces), the models of `skypilot-like`, `sagemaker-like` and
`on-demand`, and, with `--deadline-hours`, `uniform-progress`. The time costs and prices are printed
with the results; the README explains every default.

Run: `python bench/goodput.py --traces ../shared/data/spot-traces [--json] [--hours-of-work H]
[--nodes N] [--deadline-hours D]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.replay.control_plane import ReplayError  # noqa: E402
from bench.replay.model import Params, Result  # noqa: E402
from bench.replay.suite import run_all  # noqa: E402
from bench.replay.traces import TraceError, load_trace_sets  # noqa: E402

COLUMNS = ("strategy", "goodput", "$/useful GPU-h", "hours to finish", "steps lost", "interruptions", "met deadline")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = Params()
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--traces", type=Path, required=True, help="a folder of trace folders, or one trace folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--hours-of-work", type=float, default=defaults.hours_of_work, help="GPU work of the job")
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="a gang runs while a pool's count >= N")
    parser.add_argument("--deadline-hours", type=float, default=None, help="adds uniform-progress and met_deadline")
    costs = parser.add_argument_group("time costs and prices")
    costs.add_argument("--boot-seconds", type=float, default=defaults.boot_s, help="launch to training container up")
    costs.add_argument("--restore-seconds", type=float, default=defaults.restore_s, help="loading a checkpoint")
    costs.add_argument(
        "--save-stall-seconds", type=float, default=defaults.save_stall_s, help="training stall per save"
    )
    costs.add_argument("--save-commit-seconds", type=float, default=defaults.save_commit_s, help="save to committed")
    costs.add_argument(
        "--checkpoint-every-minutes",
        type=int,
        default=defaults.checkpoint_every_minutes,
        help="checkpoint interval of every strategy",
    )
    costs.add_argument("--spot-price", type=float, default=defaults.spot_usd_per_hour, help="USD per instance-hour")
    costs.add_argument(
        "--on-demand-price", type=float, default=defaults.on_demand_usd_per_hour, help="USD per instance-hour"
    )
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.hours_of_work <= 0 or args.checkpoint_every_minutes < 1:
        parser.error("--nodes, --hours-of-work and --checkpoint-every-minutes must be positive")
    if args.save_stall_seconds >= args.checkpoint_every_minutes * 60:
        parser.error("--save-stall-seconds must be shorter than the checkpoint interval")
    return args


def params_from(args: argparse.Namespace) -> Params:
    return Params(
        hours_of_work=args.hours_of_work,
        nodes=args.nodes,
        deadline_hours=args.deadline_hours,
        boot_s=args.boot_seconds,
        restore_s=args.restore_seconds,
        save_stall_s=args.save_stall_seconds,
        save_commit_s=args.save_commit_seconds,
        checkpoint_every_minutes=args.checkpoint_every_minutes,
        spot_usd_per_hour=args.spot_price,
        on_demand_usd_per_hour=args.on_demand_price,
    )


def _cell(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(params: Params, results: list[Result]) -> str:
    lines = ["parameters: " + ", ".join(f"{k}={_cell(v, 3)}" for k, v in params.as_dict().items())]
    for folder in dict.fromkeys(r.traces for r in results):
        lines += ["", f"traces: {folder}", " | ".join(COLUMNS), " | ".join("-" * len(c) for c in COLUMNS)]
        for r in (r for r in results if r.traces == folder):
            cells = (
                r.strategy,
                _cell(r.goodput),
                _cell(r.cost_per_useful_gpu_hour),
                _cell(r.hours_to_finish, 1),
                _cell(r.steps_lost),
                _cell(r.interruptions),
                _cell(r.met_deadline),
            )
            lines.append(" | ".join(cells))
        for r in (r for r in results if r.traces == folder and r.node_reclaims):
            lines.append(
                f"{r.strategy}: {r.node_reclaims} reclaim(s) of a gang's node tried the node's replacement in the"
                " gang's own pool first (none found room: here a reclaim is the pool's count falling below the gang)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = params_from(args)
    logging.basicConfig(level=logging.ERROR)  # a survivor terminated and the like: routine in a replay
    try:
        results = run_all(load_trace_sets(args.traces), params)
    except (TraceError, ReplayError) as exc:
        print(f"goodput: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"params": params.as_dict(), "results": [r.as_dict() for r in results]}, indent=2))
    else:
        print(table(params, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
