"""gpujobs: submit, watch, list and cancel training jobs, and check job specs offline.

main() parses arguments, runs one command from commands.py and turns every expected failure
(a missing file, a missing stack, a refused credential, an unreachable endpoint) into one line on
stderr and an exit code, so a user never reads a traceback for something they can fix:
0 ok, 1 invalid spec or a job that ended FAILED/REJECTED/CANCELLED while waiting, 2 usage or
configuration (including AWS access), 3 job not found, 141 a reader that closed standard output
early (`gpujobs list | head -1` prints no traceback).

Commands that live in other packages (`gpujobs local`, the local cloud of a development install)
are plugins: entry points in the `gpujobs.cli` group, loaded by name only when typed. So this
package imports none of them, and the local cloud may import the CLI without an import circle.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from importlib.metadata import entry_points
from typing import cast

from gpujobs_cli import artifacts, bake, commands, dashboard, debug, doctor, drills, queue, shell, training
from gpujobs_cli.logs import parse_since
from gpujobs_cli.resources import DEFAULT_STACK, ConfigError

EPILOG = """\
examples:
  gpujobs validate examples/digits.yaml
  gpujobs submit examples/digits.yaml --wait
  gpujobs list --state all --limit 20
  gpujobs status j-0123456789abcdef --watch
  gpujobs queue --team vision
  gpujobs quota
  gpujobs logs j-0123456789abcdef --follow
  gpujobs shell j-0123456789abcdef --node 1
  gpujobs exec j-0123456789abcdef -- nvidia-smi
  gpujobs cancel j-0123456789abcdef
  gpujobs interrupt j-0123456789abcdef --node 1
  gpujobs artifacts j-0123456789abcdef
  gpujobs download j-0123456789abcdef ./results
  gpujobs debug j-0123456789abcdef
  gpujobs dashboard
  gpujobs doctor
  gpujobs bake 123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1 --write-parameter

The stack's queue and table come from the CloudFormation stack's outputs (--stack, GPUJOBS_STACK),
or from GPUJOBS_QUEUE_URL and GPUJOBS_TABLE. AWS_ENDPOINT_URL points every AWS call elsewhere.
exit codes: 0 ok, 1 invalid spec or job ended FAILED/REJECTED/CANCELLED, 2 usage or configuration, 3 job not found,
141 standard output closed early (as by `| head`; nothing else is printed).

the local cloud (a development install): gpujobs local demo | up | tour   (gpujobs local --help)
"""

EXIT_READER_GONE = 128 + signal.SIGPIPE
"""What a shell reports for a writer whose reader went away (141)."""
PLUGIN_GROUP = "gpujobs.cli"
"""Entry point group of commands from other packages: name -> `main(argv: list[str]) -> int`."""
_PLUGIN_MISSING = {"local": "`gpujobs local` needs a development install of this repository (make setup)"}
"""The one-line answer when a plugin this CLI advertises is not installed."""

_COMMANDS = {
    "validate": (
        "check job specs offline",
        "Validate JSON or YAML job specs with the control plane's own rules, and the instance types\n"
        "against the packaged catalog of EC2's types (known types, their GPU counts and, when a region\n"
        "is given or set in AWS_REGION/AWS_DEFAULT_REGION, whether a zone there offers each); no AWS\n"
        "call is made. Prints 'ok: NAME' ('FILE: ok: NAME' for several files), or one line per problem\n"
        "('FILE: field: rule'); exits 1 when any spec is invalid.",
        "examples:\n  gpujobs validate examples/digits.yaml\n  gpujobs validate examples/*.yaml examples/*.json --json\n"
        "  gpujobs validate job.json --allowed-instance-types g5.xlarge,g6.xlarge\n  gpujobs validate job.yaml --region us-west-2\n"
        "  cat job.yaml | gpujobs validate -",
    ),
    "submit": (
        "validate a job spec and send it to the queue",
        "Validate the spec locally, add a client_token when it has none (so the job id is known\n"
        "before the control plane records it), send it to the jobs queue and print the job id.\n"
        "Nothing is sent if the spec is invalid.",
        "examples:\n  gpujobs submit examples/digits.yaml\n"
        "  gpujobs submit examples/digits.yaml --wait       # until RUNNING or finished\n"
        "  gpujobs submit job.json --client-token nightly-2025-06-01 --json",
    ),
    "status": (
        "show one job",
        "Show a job's state, cost so far, attempts, failed launch tries and history; for an ended\n"
        "job, also the GPU-hours it paid for and the part whose work was kept ('useful').\n"
        "A cost marked '~' is an upper estimate (spot is priced at the on-demand list price).",
        "examples:\n  gpujobs status j-0123456789abcdef\n  gpujobs status j-0123456789abcdef --watch\n"
        "  gpujobs status j-0123456789abcdef --json | jq .state",
    ),
    "list": (
        "list jobs by state, newest first",
        "List jobs in the given states (default: the active ones, QUEUED LAUNCHING RUNNING\n"
        "INTERRUPTED), newest first, with each job's cost so far ('~': an upper estimate).\n"
        "Reads the table's ByState index; never scans.",
        "examples:\n  gpujobs list\n  gpujobs list --state all --limit 100\n  gpujobs list --state FAILED STOPPED --json\n"
        "  gpujobs list --team ml-platform | head -5",
    ),
    "logs": (
        "print a job's output",
        "Print what one node of one attempt wrote (stdout and stderr), from the stack's job log group\n"
        "in CloudWatch Logs: the newest attempt that got instances and node 0 unless told.\n"
        "--bootstrap prints that node's bootstrap log instead (pull, rendezvous, exit).",
        "examples:\n  gpujobs logs j-0123456789abcdef\n  gpujobs logs j-0123456789abcdef --follow\n"
        "  gpujobs logs j-0123456789abcdef --attempt 2 --node 1 --since 10m\n"
        "  gpujobs logs j-0123456789abcdef --json | jq -r .message",
    ),
    "metrics": (
        "print the metrics a job's training reported",
        "Print the series the control plane kept from the job's heartbeats: time, attempt, step, each\n"
        "metric the script logged (run.log(loss=...) or step_done(metrics=...)) and the throughput,\n"
        "oldest first. The record keeps the newest 60 points; a line says how many older ones went.\n"
        "gpujobs status shows the newest while the job runs.",
        "examples:\n  gpujobs metrics j-0123456789abcdef\n"
        "  gpujobs metrics j-0123456789abcdef --json | jq '.points[] | [.step, .metrics.loss]'",
    ),
    "tensorboard": (
        "download a job's TensorBoard files and serve them locally",
        "Download the event files the job wrote under $GPUJOBS_TB_DIR (uploaded with its outputs:\n"
        "when it ends, or when it calls run.save_outputs()) to DIR, then run 'tensorboard --logdir DIR'\n"
        "if TensorBoard is installed; otherwise print the folder and how to install it.",
        "examples:\n  gpujobs tensorboard j-0123456789abcdef\n"
        "  gpujobs tensorboard j-0123456789abcdef --dir runs/j1 --port 6007\n"
        "  gpujobs tensorboard j-0123456789abcdef --no-serve",
    ),
    "queue": (
        "show the jobs waiting for their team's GPU quota, in the order they will start",
        "Show every job waiting for admission in the order the reconciler admits them (by team's\n"
        "weighted share, then priority, then submission), its place in its team's queue and overall,\n"
        "why it waits (its team's quota, the fleet's cap, a pause or a drain, with the numbers), and\n"
        "the latest it can start if running jobs run to their max_runtime_minutes and nobody goes ahead.",
        "examples:\n  gpujobs queue\n  gpujobs queue --team vision\n  gpujobs queue --json | jq '.[0]'",
    ),
    "quota": (
        "show each team's GPUs against its quota",
        "Show, per team, the GPUs its jobs hold (their own and borrowed from other teams' idle quota),\n"
        "its quota, fair-share weight, whether it borrows and lends, and how many of its jobs wait;\n"
        "then the fleet's GPUs against its cap. From the GPU ledger and the team configuration.",
        "examples:\n  gpujobs quota\n  gpujobs quota --json | jq '.teams[] | select(.waiting > 0)'",
    ),
    "shell": (
        "open a shell in a running job's container (SSM Session Manager)",
        "Open an interactive shell (bash, else sh) in the container of node K of the job's running\n"
        "attempt, as the workload's user, through SSM Session Manager and the stack's ShellDocument:\n"
        "no SSH key, no open port. Needs AWS's session-manager-plugin on PATH and, for a team's user,\n"
        "the team's policy (docs/security.md): only the team's own jobs' instances are allowed.",
        "examples:\n  gpujobs shell j-0123456789abcdef\n  gpujobs shell j-0123456789abcdef --node 1",
    ),
    "exec": (
        "run one command in a running job's container and print its output",
        "Run one command (an argv after --, never a shell string) in the container of node K of the\n"
        "job's running attempt through SSM Run Command and the stack's ExecDocument; print its output\n"
        "(SSM keeps up to 24,000 characters of each stream) and exit with its exit code (255 when it\n"
        "never ran or gave none: SSM timed it out after 600 s or could not deliver it).",
        "examples:\n  gpujobs exec j-0123456789abcdef -- nvidia-smi\n"
        "  gpujobs exec j-0123456789abcdef --node 1 -- ls -la /tmp\n"
        "  gpujobs exec j-0123456789abcdef --json -- python -c 'import torch; print(torch.__version__)'",
    ),
    "cancel": (
        "request a job's cancellation",
        "Send a cancel request for a job; its instances are terminated by the control plane.\n"
        "A job that has already ended is left alone (exit 0).",
        "examples:\n  gpujobs cancel j-0123456789abcdef\n  gpujobs cancel j-0123456789abcdef --json",
    ),
    "interrupt": (drills.SUMMARY, drills.DESCRIPTION, drills.EPILOG),
    "artifacts": (
        "list what a job left in its outputs",
        "List the files a job wrote to $GPUJOBS_OUTPUT_DIR, as uploaded to s3://<bucket>/outputs/<job-id>/:\n"
        "node 0's at the top, node K's under node-K/. Uploaded when the job ends and whenever it asks.",
        "examples:\n  gpujobs artifacts j-0123456789abcdef\n  gpujobs artifacts j-0123456789abcdef --json | jq '.[].key'",
    ),
    "download": (
        "download a job's outputs",
        "Download every file of a job's outputs into DIR (default: ./<job-id>), keeping their folders.\n"
        "Refuses to overwrite an existing file unless --force. A key that is not a plain path inside\n"
        "DIR, or that no disk can hold (a name over 255 bytes, a key that is also another's folder:\n"
        "`a` beside `a/b`), is skipped with a line naming it and why; the rest are downloaded and the\n"
        "command exits 1 when anything was skipped. Progress goes to stderr.",
        "examples:\n  gpujobs download j-0123456789abcdef\n  gpujobs download j-0123456789abcdef ./results --force",
    ),
    "debug": (debug.SUMMARY, debug.DESCRIPTION, debug.EPILOG),
    "dashboard": (
        "print the URL of the stack's CloudWatch dashboard",
        "Print the console URL of the stack's operations dashboard (jobs by state, launches and\n"
        "capacity refusals by pool, interruptions, steps lost, warning-to-resumed seconds, idle\n"
        "and budget stops, estimated cost per team, dead-letter depth, function errors). The\n"
        "name comes from the stack output DashboardName, or GPUJOBS_DASHBOARD.",
        'examples:\n  gpujobs dashboard\n  open "$(gpujobs dashboard)"\n  gpujobs dashboard --json | jq -r .url',
    ),
    "doctor": (
        "check the account a stack is deployed in",
        "Check the deployed stack's account against docs/deploy.md's checklist: Lambda concurrency,\n"
        "EC2 vCPU quotas (on-demand and spot) for the allowed types, the EBS default key against the\n"
        "stack's EbsKmsKeyArn, NAT routes or VPC endpoints of the subnets, the spot service-linked\n"
        "role, the alarm topic's subscribers. Each line is ok, warn, FAIL or unknown (a call refused or\n"
        "not available, named). Exits 1 when any check fails.",
        "examples:\n  gpujobs doctor\n  gpujobs doctor --stack gpujobs-staging --region eu-west-1\n"
        "  gpujobs doctor --json | jq '.[] | select(.status != \"ok\")'",
    ),
    "bake": (bake.SUMMARY, bake.DESCRIPTION, bake.EPILOG),
    "schema": (
        "print the job spec's JSON Schema",
        "Print the JSON Schema generated from the job spec model (for editors and CI checks).",
        "examples:\n  gpujobs schema > job-spec.schema.json",
    ),
}


def _allowed_types(value: str) -> list[str]:
    types = [t.strip() for t in value.split(",") if t.strip()]
    if not types:
        raise argparse.ArgumentTypeError("expected a comma-separated list of instance types")
    return types


def _limit(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if not 1 <= number <= 1000:
        raise argparse.ArgumentTypeError("must be between 1 and 1000")
    return number


def _since(value: str) -> timedelta:
    try:
        return parse_since(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attempt", type=int, metavar="N", help="attempt N (default: the newest that got instances)")
    parser.add_argument("--node", type=int, default=0, metavar="K", help="node K of the attempt (default 0, rank 0)")
    parser.add_argument(
        "--follow", "-f", action="store_true", help="keep printing until the attempt ends (Ctrl-C stops)"
    )
    parser.add_argument("--since", type=_since, metavar="AGE", help="only lines younger than AGE: 30s, 10m, 2h, 1d")
    parser.add_argument("--bootstrap", action="store_true", help="the node's bootstrap log instead of its output")


def build_parser() -> argparse.ArgumentParser:
    # Global options are accepted before or after the command; SUPPRESS keeps a subcommand's
    # unset copy from overwriting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--stack",
        default=argparse.SUPPRESS,
        help=f"CloudFormation stack name (default: $GPUJOBS_STACK or {DEFAULT_STACK})",
    )
    common.add_argument("--region", default=argparse.SUPPRESS, help="AWS region (default: boto3's configuration)")
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="gpujobs", description=__doc__.splitlines()[0], epilog=EPILOG, formatter_class=raw, parents=[common]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    made = {}
    for name, (summary, description, epilog) in _COMMANDS.items():
        made[name] = sub.add_parser(
            name, help=summary, description=description, epilog=epilog, formatter_class=raw, parents=[common]
        )
    made["validate"].add_argument(
        "files", nargs="+", metavar="FILE", help="job specs, JSON or YAML ('-' for standard input)"
    )
    made["submit"].add_argument("file", metavar="FILE", help="job spec, JSON or YAML ('-' for standard input)")
    for name in ("validate", "submit"):
        made[name].add_argument(
            "--allowed-instance-types",
            type=_allowed_types,
            metavar="A,B",
            help="also check instance_types against this allow-list (the stack's AllowedInstanceTypes)",
        )
    made["submit"].add_argument("--wait", action="store_true", help="poll every 2 s until RUNNING or finished")
    made["submit"].add_argument("--client-token", metavar="T", help="idempotency token (default: the spec's, or new)")
    for name in ("status", "cancel", "logs"):
        made[name].add_argument("job_id", metavar="ID", help="job id, as printed by submit (j-...)")
    _add_logs_arguments(made["logs"])
    bake.add_arguments(made["bake"])
    shell.add_arguments(made["shell"], made["exec"])
    drills.add_arguments(made["interrupt"])
    debug.add_arguments(made["debug"])
    made["status"].add_argument("--watch", action="store_true", help="refresh every 2 s until the job ends")
    for name in ("artifacts", "download"):
        made[name].add_argument("job_id", metavar="ID", help="job id, as printed by submit (j-...)")
    made["artifacts"].add_argument("--json", action="store_true", help="print JSON instead of text")
    made["download"].add_argument("dir", metavar="DIR", nargs="?", help="where to put the files (default: ./ID)")
    made["download"].add_argument("--force", action="store_true", help="overwrite files that already exist")
    made["list"].add_argument(
        "--state",
        action="extend",
        nargs="+",
        metavar="S",
        help="states to list (repeatable or comma-separated); 'all' for every state",
    )
    made["list"].add_argument("--limit", type=_limit, default=50, metavar="N", help="at most N jobs (default 50)")
    made["list"].add_argument("--team", metavar="T", help="only team T's jobs")
    made["queue"].add_argument("--team", metavar="T", help="only team T's waiting jobs (their places stay overall)")
    training.add_arguments(made)
    for name in ("validate", "submit", "status", "list", "cancel", "logs", "dashboard", "doctor", "queue", "quota"):
        made[name].add_argument("--json", action="store_true", help="print JSON instead of text")
    handlers = {
        "validate": commands.cmd_validate,
        "submit": commands.cmd_submit,
        "status": commands.cmd_status,
        "list": commands.cmd_list,
        "cancel": commands.cmd_cancel,
        "interrupt": drills.cmd_interrupt,
        "dashboard": dashboard.cmd_dashboard,
        "schema": commands.cmd_schema,
        "logs": commands.cmd_logs,
        "artifacts": artifacts.cmd_artifacts,
        "download": artifacts.cmd_download,
        "debug": debug.cmd_debug,
        "doctor": doctor.cmd_doctor,
        "bake": bake.cmd_bake,
        "metrics": training.cmd_metrics,
        "tensorboard": training.cmd_tensorboard,
        "queue": queue.cmd_queue,
        "quota": queue.cmd_quota,
        "shell": shell.cmd_shell,
        "exec": shell.cmd_exec,
    }
    for name, handler in handlers.items():
        made[name].set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] not in _COMMANDS and not args_list[0].startswith("-"):
        plugin = _plugin(args_list[0])
        if plugin is not None:
            return plugin(args_list[1:])
        if args_list[0] in _PLUGIN_MISSING:
            return _fail(_PLUGIN_MISSING[args_list[0]], commands.EXIT_USAGE)
    args_list, command_argv = shell.split_command(args_list)
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help (0) and usage errors (2): argparse has printed already
        return exc.code if isinstance(exc.code, int) else commands.EXIT_USAGE
    args.argv = command_argv
    args.stack = getattr(args, "stack", None) or os.environ.get("GPUJOBS_STACK") or DEFAULT_STACK
    args.region = getattr(args, "region", None)
    try:
        code: int = args.handler(args)
        sys.stdout.flush()  # here, not at exit: a reader gone early (`| head`) is handled below
    except BrokenPipeError:
        return _reader_gone()
    except commands.CommandError as exc:
        return _fail(str(exc), exc.code)
    except ConfigError as exc:
        return _fail(str(exc), commands.EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:
        message = _aws_problem(exc)
        if message is None:
            raise
        return _fail(message, commands.EXIT_USAGE)
    return code


def _plugin(name: str) -> Callable[[list[str]], int] | None:
    """The command `name` offered by another installed package, or None.

    A command that is offered but cannot be imported (its package's dependencies are missing) counts
    as not installed.
    """
    point = next(iter(entry_points(group=PLUGIN_GROUP, name=name)), None)
    if point is None:
        return None
    try:
        return cast(Callable[[list[str]], int], point.load())
    except ImportError:
        return None


def _reader_gone() -> int:
    """Standard output's reader has closed it (`gpujobs list | head -1`): stop quietly, exiting as a
    Unix tool killed by SIGPIPE would (141). Output still buffered would fail again as Python
    flushes it at exit, so standard output is pointed at /dev/null first."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):  # not a real file (a test's capture)
        pass
    return EXIT_READER_GONE


def _fail(message: str, code: int) -> int:
    print(f"gpujobs: {message}", file=sys.stderr)
    return code


def _aws_problem(exc: Exception) -> str | None:
    """One line for an AWS failure (credentials, region, endpoint, a refused call); None otherwise."""
    botocore_exceptions = sys.modules.get("botocore.exceptions")
    if botocore_exceptions is None:
        return None
    if isinstance(exc, botocore_exceptions.NoRegionError):
        return "no AWS region configured: pass --region or set AWS_REGION"
    if isinstance(exc, botocore_exceptions.NoCredentialsError | botocore_exceptions.PartialCredentialsError):
        return f"{exc}: configure AWS credentials (AWS_PROFILE, aws sso login, or AWS_ACCESS_KEY_ID)"
    if isinstance(exc, botocore_exceptions.EndpointConnectionError):
        return f"{exc} (check AWS_ENDPOINT_URL and the network)"
    if isinstance(exc, botocore_exceptions.ClientError | botocore_exceptions.BotoCoreError):
        return " ".join(str(exc).split())
    return None


if __name__ == "__main__":
    sys.exit(main())
