"""`gpujobs-local up`: run the local cloud in the foreground until Ctrl-C or SIGTERM.

It prints what another shell exports (so `gpujobs submit/status/list/cancel` and `aws sqs
send-message --queue-url ...` reach it), the stack's outputs, then one line per handler invocation.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

from gpujobs_local.cloud import Delivery, LocalCloud
from gpujobs_local.session import (
    LOCAL_INSTANCE_TYPES,
    SPOT_NOTICE_SECONDS,
    add_instance_python_option,
    attach_runner,
)
from gpujobs_local.stack import MOTO_SENDER
from gpujobs_local.story import MetricLineFilter

SEND_MESSAGE = (
    'aws sqs send-message --endpoint-url "$AWS_ENDPOINT_URL" --queue-url "$GPUJOBS_QUEUE_URL" '
    "--message-body file://examples/cpu-smoke.json"
)
"""The README's line: AWS CLI v1 sends SQS calls to its own legacy endpoint unless the command line
names one (it ignores AWS_ENDPOINT_URL there); v2 honours either."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpujobs local up",
        description=(
            "Run the gpujobs control plane on this machine: a moto server on 127.0.0.1 holding the stack "
            "built from template.yaml, and the real Lambda handlers fed by its queue, rules, topic and "
            "schedule; every instance it launches runs the real bootstrap and trainer as local processes. "
            "Prints what to export in another shell; Ctrl-C stops everything."
        ),
    )
    parser.add_argument("--workdir", type=Path, default=None, help="directory for local state (default: a temp dir)")
    parser.add_argument(
        "--reconcile-every", type=float, default=5.0, metavar="SECONDS", help="reconciler period (default: 5)"
    )
    parser.add_argument("--stack-name", default="gpujobs-local", help="stack name (default: gpujobs-local)")
    parser.add_argument("--quiet", action="store_true", help="do not print a line per delivery")
    parser.add_argument(
        "--teams",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"team configuration (JSON, docs/deploy.md 'Teams'); moto sends every message as {MOTO_SENDER}, "
        "so list that principal for the teams you submit as (default: none)",
    )
    add_instance_python_option(parser)
    return parser


def up(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    temp = None
    workdir: Path = args.workdir
    if workdir is None:
        temp = tempfile.TemporaryDirectory(prefix="gpujobs-local-")
        workdir = Path(temp.name)
    out = sys.stdout
    sys.stdout = MetricLineFilter(out)
    cloud = LocalCloud(
        workdir=workdir,
        stack_name=args.stack_name,
        reconcile_every=args.reconcile_every,
        allowed_instance_types=LOCAL_INSTANCE_TYPES,
        teams=args.teams.read_text(encoding="utf-8") if args.teams else None,
    )
    started = time.monotonic()
    try:
        print("starting the local cloud ...", file=out, flush=True)
        cloud.start()
        attach_runner(cloud, workdir=workdir, instance_python=args.instance_python)
        print(f"moto on {cloud.endpoint_url}, stack {cloud.stack_name} from template.yaml\n", file=out)
        print("# in another shell:", file=out)
        for key, value in cloud.exports().items():
            print(f"export {key}={shlex.quote(value)}", file=out)
        print(f"# (or: source {shlex.quote(str(workdir / 'env.sh'))})", file=out)
        print("# then, from the repository root: gpujobs submit examples/digits.yaml, or with the AWS CLI", file=out)
        print(
            f"# (v1 needs --endpoint-url for SQS): {SEND_MESSAGE}\n# a spot drill: gpujobs interrupt JOB [--node K]"
            f" (reclaimed {SPOT_NOTICE_SECONDS:g} s after the warning)\n",
            file=out,
        )
        print("# stack outputs:", file=out)
        for key, value in cloud.outputs.items():
            print(f"#   {key:<26} {value}", file=out)
        print("\nwaiting for events; Ctrl-C stops.", file=out, flush=True)

        if not args.quiet:

            def show(delivery: Delivery) -> None:
                if delivery.kind == "Scheduled Event" and delivery.ok:
                    return  # a quiet reconciler tick is not news
                print(f"[{time.monotonic() - started:7.1f}s] {delivery.line()}", file=out, flush=True)

            cloud.on_delivery(show)
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        print("\nstopping ...", file=out, flush=True)
        try:
            cloud.stop()
        finally:
            sys.stdout = out
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
            if temp is not None:
                temp.cleanup()
    print("stopped; nothing left running.", flush=True)
    return 0


COMMANDS = {
    "demo": "a job survives a spot interruption, end to end (what `make demo` runs)",
    "up": "run the local cloud until Ctrl-C, for the gpujobs CLI and aws CLI in another shell",
    "tour": "the control plane alone on moto: launches, capacity fallback, duplicates, rejects, cancel",
}


def main(argv: list[str] | None = None) -> int:
    """`gpujobs local COMMAND` (also the `gpujobs-local` script)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: gpujobs local {demo,up,tour} [--help]\n")
        for name, what in COMMANDS.items():
            print(f"  {name:<5} {what}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from gpujobs_local.demo import main as demo

        return demo(rest)
    if command == "tour":
        from gpujobs_local.tour import main as tour

        return tour(rest)
    return up(rest)


if __name__ == "__main__":
    sys.exit(main())
