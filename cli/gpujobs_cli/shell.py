"""`gpujobs shell` and `gpujobs exec`: into a running job's container through SSM, no SSH.

No key, no open port: both go through the SSM agent the instance already runs, with one of the
stack's own SSM documents, which the team's users may use only on their team's instances
(`user_access.team_user_policy`: `ssm:resourceTag/gpujobs:team`, and `ssm:SessionDocumentAccessCheck`
so that no other session document, the agent's default root shell on the host included, is theirs).

* `shell` starts a Session Manager session with `ShellDocument` (InteractiveCommands: `docker exec
  -it <container> bash`, or sh) and hands it to AWS's `session-manager-plugin`, as `aws ssm
  start-session` does: StartSession's answer, the region, the request. The plugin is AWS's, not a
  Python package: where it is missing the command says so with its install link, before any
  session is started.
* `exec` runs one command through Run Command with `ExecDocument`: the argv travels as one
  parameter, base64 of a JSON list of strings (`argv_parameter`), which the document's
  allowedPattern admits only as base64; on the host a fixed python3 line decodes it and execs
  `docker exec <container> ARGV...`. So no user string is ever parsed by a shell, here or there.
  It prints the command's output (as Run Command keeps it: up to 24,000 characters of each stream)
  and exits with the command's exit code.

Both reach the job's current attempt while it runs, and a FAILED job's gang kept for inspection
(`keep_on_failure`, `domain.keep`) until its keep is over: there the container is the crashed one's
filesystem, running idle under the same name.

The container name in both documents is checked by the same allowedPattern as the checkpoint
document's (`gpujobs-j-<16 hex>-a<attempt>`), so SSM refuses any other value before anything runs.
Either way the process runs as the workload's user, inside the container's confinement
(`instance/confinement.py`): no capability, no IMDS.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpujobs.contract import container_name
from gpujobs.domain import keep
from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from gpujobs_cli import commands
from gpujobs_cli.commands import EXIT_NOT_FOUND, CommandError, _get, _store
from gpujobs_cli.resources import EXEC_DOCUMENT, SHELL_DOCUMENT, TABLE, discover

PLUGIN = "session-manager-plugin"
PLUGIN_INSTALL_URL = (
    "https://docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-install-plugin.html"
)
MAX_ARGV_PARAMETER = 8000
"""Characters of the base64 argv parameter the exec document's allowedPattern admits."""
EXEC_TIMEOUT_SECONDS = 600
"""The exec document's step timeout: a longer command belongs in a shell (or in the job)."""
EXIT_NOT_RUN = 255
"""`exec`'s exit when the command never gave an exit code (SSM timed it out or could not deliver it), as ssh."""
_RUNNING = frozenset({"Pending", "InProgress", "Delayed"})
POLL_SECONDS = 1.0
sleep: Callable[[float], None] = time.sleep
"""Replaced in tests, so that the wait for a command's end runs without waiting."""


@dataclass(frozen=True)
class Target:
    """Where a shell or a command goes: node `node` of attempt `attempt`, its instance and container."""

    job_id: str
    attempt: int
    node: int
    instance_id: str
    container: str


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    status: str


def find_target(job: Job, *, node: int, now: datetime) -> Target:
    """Node `node` of the job's attempt that runs now, or of a FAILED job's gang kept for inspection
    (`keep_on_failure`) until its keep is over; CommandError (naming why) when none is there."""
    nodes = job.spec.nodes if job.spec is not None else 1
    if not 0 <= node < nodes:
        raise CommandError(f"{job.job_id} runs on {nodes} node(s): --node takes 0 to {nodes - 1}, not {node}")
    attempt = job.current_attempt
    kept = attempt is not None and keep.spares(job, attempt.number, now=now)
    runs = job.state in (JobState.RUNNING, JobState.INTERRUPTED) and attempt is not None and not attempt.is_over
    if attempt is None or not (runs or kept):
        over = " (its keep for inspection is over)" if job.kept is not None else ""
        raise CommandError(f"{job.job_id} is {job.state.value}{over}: no container of it runs now", EXIT_NOT_FOUND)
    if node >= len(attempt.instance_ids):
        raise CommandError(
            f"node {node} of {job.job_id} has no instance now (attempt {attempt.number})", EXIT_NOT_FOUND
        )
    instance_id = attempt.instance_ids[node]
    if instance_id in attempt.gone:
        raise CommandError(f"node {node} of {job.job_id} ({instance_id}) is gone", EXIT_NOT_FOUND)
    return Target(job.job_id, attempt.number, node, instance_id, container_name(job.job_id, attempt.number))


def argv_parameter(argv: Sequence[str]) -> str:
    """The exec document's `argv`: base64 of the JSON list, so that only [A-Za-z0-9+/=] travels."""
    if not argv:
        raise CommandError("exec needs a command after --, as in: gpujobs exec ID -- nvidia-smi")
    encoded = base64.b64encode(json.dumps(list(argv)).encode()).decode()
    if len(encoded) > MAX_ARGV_PARAMETER:
        raise CommandError(f"the command is too long for exec ({len(encoded)} > {MAX_ARGV_PARAMETER} encoded)")
    return encoded


def find_plugin() -> str:
    """The session-manager-plugin's path; CommandError with its install link where it is missing."""
    plugin = shutil.which(PLUGIN)
    if plugin is None:
        raise CommandError(
            f"gpujobs shell needs AWS's {PLUGIN} on PATH (the session is carried by it): install it"
            f" from {PLUGIN_INSTALL_URL}"
        )
    return plugin


def start_shell(ssm: Any, target: Target, *, plugin: str, document: str, region: str, profile: str) -> int:
    """StartSession with the stack's shell document, then the plugin carries the terminal."""
    request = {
        "Target": target.instance_id,
        "DocumentName": document,
        "Parameters": {"containerName": [target.container]},
    }
    session = ssm.start_session(**request)
    answer = {k: session[k] for k in ("SessionId", "TokenValue", "StreamUrl")}
    # The plugin's argv, as the AWS CLI passes it: answer, region, operation, profile, request, endpoint.
    argv = [plugin, json.dumps(answer), region, "StartSession", profile, json.dumps(request), ssm.meta.endpoint_url]
    return _run_plugin(argv)


def _run_plugin(argv: list[str]) -> int:
    """Ctrl-C belongs to the remote shell: the plugin forwards it, this process ignores it meanwhile."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.run(argv, check=False).returncode
    finally:
        signal.signal(signal.SIGINT, previous)


def run_command(ssm: Any, target: Target, *, document: str, argv: Sequence[str]) -> ExecResult:
    """SendCommand with the stack's exec document, then GetCommandInvocation until it has ended."""
    sent = ssm.send_command(
        InstanceIds=[target.instance_id],
        DocumentName=document,
        Parameters={"containerName": [target.container], "argv": [argv_parameter(argv)]},
        TimeoutSeconds=60,
        Comment=f"gpujobs exec: {target.container}"[:100],
    )
    command_id = sent["Command"]["CommandId"]
    while True:
        try:
            found = ssm.get_command_invocation(CommandId=command_id, InstanceId=target.instance_id)
        except ssm.exceptions.InvocationDoesNotExist:  # just sent: not yet visible
            found = {"Status": "Pending"}
        if found["Status"] not in _RUNNING:
            break
        sleep(POLL_SECONDS)
    return ExecResult(
        exit_code=int(found.get("ResponseCode", -1)),
        stdout=found.get("StandardOutputContent", ""),
        stderr=found.get("StandardErrorContent", ""),
        status=found["Status"],
    )


def cmd_shell(args: argparse.Namespace) -> int:
    plugin = find_plugin()  # before any AWS call: no session is left behind without it
    resources = discover(stack=args.stack, region=args.region, needs=(TABLE, SHELL_DOCUMENT))
    target = find_target(_get(_store(resources), args.job_id), node=args.node, now=commands.utc_now())
    print(f"shell in {target.container} on {target.instance_id} (node {target.node})", file=sys.stderr)
    profile = os.environ.get("AWS_PROFILE", "")
    ssm = resources.client("ssm")
    document, region = resources.values[SHELL_DOCUMENT], resources.region_name
    return start_shell(ssm, target, plugin=plugin, document=document, region=region, profile=profile)


def cmd_exec(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    argv_parameter(argv)  # a usage error before any AWS call
    resources = discover(stack=args.stack, region=args.region, needs=(TABLE, EXEC_DOCUMENT))
    target = find_target(_get(_store(resources), args.job_id), node=args.node, now=commands.utc_now())
    result = run_command(resources.client("ssm"), target, document=resources.values[EXEC_DOCUMENT], argv=argv)
    if args.json:
        print(json.dumps({"instance_id": target.instance_id, "node": target.node, **result.__dict__}))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.status != "Success":
            print(f"gpujobs: {result.status.lower()}: exit code {result.exit_code}", file=sys.stderr)
    return result.exit_code if result.exit_code >= 0 else EXIT_NOT_RUN


def add_arguments(shell: argparse.ArgumentParser, exec_: argparse.ArgumentParser) -> None:
    for parser in (shell, exec_):
        parser.add_argument("job_id", metavar="ID", help="job id, as printed by submit (j-...)")
        parser.add_argument("--node", type=int, default=0, metavar="K", help="node K of the gang (default 0, rank 0)")
    exec_.add_argument("--json", action="store_true", help="print JSON (exit_code, stdout, stderr, status)")
    exec_.usage = "gpujobs exec [-h] [--stack STACK] [--region REGION] [--node K] [--json] ID -- CMD [ARG ...]"


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`exec`'s own arguments, and the command's words after its first `--`, taken as they are
    (argparse would read a command's `--json` or a second `--` as its own)."""
    if "--" not in argv or "exec" not in argv[: argv.index("--")]:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]
