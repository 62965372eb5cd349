"""``python -m gpujobs_trainer.launch -- <command...>``: the container's entrypoint.

Reads the bootstrap's environment, runs torchrun (static rendezvous at the rank-0 node's private
IP, a fresh rendezvous id per attempt, no in-place restarts: the control plane replaces whole
instances and the job resumes from its checkpoint), forwards signals and maps the outcome to one
exit code: 0 succeeded, 75 preempted with a committed checkpoint, 78 configuration error,
127/126 the command's program (or python's script) is not found / not executable (checked before
torchrun, which would only crash on it; the codes a shell and `docker run` give), 74 (``checkpoint:
directory``) the script ended well but its folder's last sync failed, 1 anything else.

Signals: SIGTERM/SIGINT go to torchrun, which forwards SIGTERM to the workers and waits
``GPUJOBS_SHUTDOWN_TIMEOUT`` seconds before SIGKILL. SIGUSR1 ("checkpoint now, keep training")
cannot go through torchrun: torchrun treats every signal it handles as a reason to shut down.
So the launcher sends SIGUSR1 straight to torchrun's worker processes, and only to those that
handle it (a script that has not reached `gpujobs_trainer.init` yet would be killed by it).
SIGUSR2 ("dump your stacks": the control plane found the gang hung and kills it next) dumps every
worker's stacks beside the outputs in a thread of its own (`stack_dumps`), and never reaches torchrun.

Under the instance bootstrap, the launcher asks for the output folder's upload and waits for it
before reporting its exit: that report may end the job, and the instance with it. A node of a gang
that stopped at a warning (75) leaves the report to the bootstrap, which may start it again when the
gang regroups around a reclaimed node's replacement (`regroup_may_follow`).

Before the command starts, the spec's ``code:`` archive (GPUJOBS_CODE_URI) is unpacked into the
working directory (`code_archive`), a multi-node gang's all-reduce bandwidth checked against its
floor (`interconnect`: 123 below it, before any of the job's code runs), its ``requirements:``
installed into a cached venv layered on the image and its ``setup:`` commands run
(`dependencies`). Scripts without the trainer library (GPUJOBS_CHECKPOINT_MODE ``directory`` or
``none``) get their checkpoint folder, its sync and their exit code from `script_checkpoints`, and
never SIGUSR1; node 0's launcher reports their progress (each sync, and a heartbeat while the
script runs), which such a script cannot do itself. Workers hung after their reports: `teardown`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from gpujobs_trainer import code_archive, dependencies, interconnect
from gpujobs_trainer.errors import (
    COMMAND_NOT_EXECUTABLE_EXIT_CODE,
    COMMAND_NOT_FOUND_EXIT_CODE,
    CONFIG_ERROR_EXIT_CODE,
    CRASH_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    SLOW_INTERCONNECT_EXIT_CODE,
    CheckpointError,
    ConfigError,
)
from gpujobs_trainer.events import JOB_EXITED, EventBridgePublisher, make_publisher
from gpujobs_trainer.outcome import JobOutcome, decide_exit, read_outcomes
from gpujobs_trainer.outputs import (
    DEFAULT_OUTPUT_DIR,
    OUTPUT_DIR_ENV,
    TensorboardUploads,
    tensorboard_env,
    upload_and_wait,
)
from gpujobs_trainer.script_checkpoints import GPUJOBS, ScriptCheckpoints, checkpoint_mode
from gpujobs_trainer.stack_dumps import dump_and_upload, nccl_flight_recorder_env
from gpujobs_trainer.teardown import DEFAULT_GRACE_SECONDS, GRACE_ENV, TeardownWatch, exit_code_within
from gpujobs_trainer.torchrun_output import TorchrunStderr
from gpujobs_trainer.workers import Worker, catches, child_pids, rank_of

log = logging.getLogger("gpujobs_trainer.launch")

DEFAULT_MASTER_PORT = 29500
DEFAULT_SHUTDOWN_TIMEOUT = 90
FINAL_UPLOAD_TIMEOUT = 900.0
"""Longest wait for the bootstrap's upload of the output folder before the exit is reported."""


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    rdzv_id: str
    shutdown_timeout: int
    teardown_grace: int = DEFAULT_GRACE_SECONDS
    """GPUJOBS_TEARDOWN_GRACE_SECONDS: how long workers may outlive every local report (`teardown`)."""
    command: tuple[str, ...]
    job_id: str
    attempt: int
    instance_id: str = ""
    """GPUJOBS_INSTANCE_ID (set by the instance bootstrap); the control plane keys exit codes by it."""
    checkpoint_mode: str = GPUJOBS
    """GPUJOBS_CHECKPOINT_MODE: gpujobs (the trainer library), directory or none."""
    code_uri: str = ""
    """GPUJOBS_CODE_URI: the code archive to unpack first, checked against GPUJOBS_CODE_SHA256."""
    code_sha256: str = ""


def plan_from_env(env: Mapping[str, str], command: Sequence[str], *, gpu_count: int) -> LaunchPlan:
    """Pure: the launch that the environment asks for, or ConfigError naming what is wrong."""
    if not command:
        raise ConfigError("no training command given: usage `python -m gpujobs_trainer.launch -- python train.py`")

    def integer(name: str, default: int) -> int:
        raw = env.get(name, "").strip()
        if not raw:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, not {raw!r}") from None

    nnodes = integer("GPUJOBS_NNODES", 1)
    node_rank = integer("GPUJOBS_NODE_RANK", 0)
    nproc = integer("GPUJOBS_NPROC_PER_NODE", gpu_count if gpu_count > 0 else 1)
    master_addr = env.get("GPUJOBS_MASTER_ADDR", "").strip()
    if nnodes < 1 or nproc < 1:
        raise ConfigError(f"GPUJOBS_NNODES ({nnodes}) and GPUJOBS_NPROC_PER_NODE ({nproc}) must be >= 1")
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"GPUJOBS_NODE_RANK {node_rank} is outside 0..{nnodes - 1}")
    if (grace := integer(GRACE_ENV, DEFAULT_GRACE_SECONDS)) < 0:
        raise ConfigError(f"{GRACE_ENV} must be >= 0 seconds, not {grace}")
    if nnodes > 1 and not master_addr:
        raise ConfigError("GPUJOBS_MASTER_ADDR (rank-0 private IP) is required when GPUJOBS_NNODES > 1")
    job_id = env.get("GPUJOBS_JOB_ID", "").strip() or "local"
    attempt = integer("GPUJOBS_ATTEMPT", 0)
    return LaunchPlan(
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=nproc,
        master_addr=master_addr,
        master_port=integer("GPUJOBS_MASTER_PORT", DEFAULT_MASTER_PORT),
        rdzv_id=f"{job_id}-attempt-{attempt}",
        shutdown_timeout=integer("GPUJOBS_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT),
        teardown_grace=grace,
        command=tuple(command),
        job_id=job_id,
        attempt=attempt,
        instance_id=env.get("GPUJOBS_INSTANCE_ID", "").strip(),
        checkpoint_mode=checkpoint_mode(env),
        code_uri=env.get("GPUJOBS_CODE_URI", "").strip(),
        code_sha256=env.get("GPUJOBS_CODE_SHA256", "").strip(),
    )


def torchrun_argv(plan: LaunchPlan, *, python: str = sys.executable) -> list[str]:
    """Pure: the torchrun command line; the user's command is passed as argv, never to a shell."""
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(plan.nnodes),
        "--nproc-per-node",
        str(plan.nproc_per_node),
        "--max-restarts",
        "0",
        "--shutdown-timeout",
        str(plan.shutdown_timeout),
    ]
    if plan.nnodes == 1 and not plan.master_addr:
        argv.append("--standalone")
    else:
        argv += [
            "--node-rank",
            str(plan.node_rank),
            "--master-addr",
            plan.master_addr,
            "--master-port",
            str(plan.master_port),
            "--rdzv-id",
            plan.rdzv_id,
        ]
    return [*argv, "--no-python", *plan.command]


def unrunnable(command: Sequence[str], *, path: str) -> tuple[int, str] | None:
    """(exit code, the line that says why) when `command` cannot start; None when it can.

    Its program not found (127) or not executable (126), as a shell reports them; or, for
    `python [options] script.py`, a script that does not exist (127 rather than python's own 2,
    which torchrun would turn into a crash): each fails the same way on every attempt.
    """
    program = command[0]
    if "/" not in program:
        if shutil.which(program, path=path) is None:
            return COMMAND_NOT_FOUND_EXIT_CODE, f"{program}: command not found"
    elif not os.path.exists(program):
        return COMMAND_NOT_FOUND_EXIT_CODE, f"{program}: No such file or directory"
    elif os.path.isdir(program) or not os.access(program, os.X_OK):
        return COMMAND_NOT_EXECUTABLE_EXIT_CODE, f"{program}: Permission denied"
    script = python_script(command)
    if script is not None and not os.path.isfile(script):
        return COMMAND_NOT_FOUND_EXIT_CODE, f"{program}: can't open file {script!r}: No such file or directory"
    return None


def python_script(command: Sequence[str]) -> str | None:
    """The script `python [options] script ...` runs; None for `-c`, `-m`, stdin or another program."""
    if not os.path.basename(command[0]).startswith("python"):
        return None
    args = iter(command[1:])
    for arg in args:
        if arg in ("-c", "-m", "-") or arg.startswith(("-c", "-m")):
            return None
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            next(args, None)  # the option's value
        elif not arg.startswith("-"):
            return arg
    return None


def run(
    plan: LaunchPlan, env: Mapping[str, str], *, own: ScriptCheckpoints | None = None, python: str = sys.executable
) -> JobOutcome:
    """Run torchrun (with ``python``: the job's venv's, `dependencies`) to its end; ``own``: the
    checkpoint folder of a script without the library."""
    outcome_dir = Path(tempfile.mkdtemp(prefix="gpujobs-outcome-"))
    child_env = {**env, "GPUJOBS_OUTCOME_DIR": str(outcome_dir), "GPUJOBS_NODE_RANK": str(plan.node_rank)}
    child_env.update(own.env if own is not None else {})
    stacks_dir = Path(tempfile.mkdtemp(prefix="gpujobs-stacks-"))
    child_env.update(nccl_flight_recorder_env(env, stacks_dir))
    argv = torchrun_argv(plan, python=python)
    started: list[subprocess.Popen[bytes]] = []
    stopped: list[str] = []

    def stop(why: str) -> None:
        log.info("%s: asking workers to checkpoint and stop", why)
        stopped.append(why)
        for proc in started:
            proc.send_signal(signal.SIGTERM)

    def forward_stop(signum: int, _frame: FrameType | None) -> None:
        stop(f"got {signal.Signals(signum).name}")

    def forward_checkpoint(_signum: int, _frame: FrameType | None) -> None:
        if plan.checkpoint_mode != GPUJOBS:
            log.info("got SIGUSR1: ignored (checkpoint mode %s takes no checkpoint-now)", plan.checkpoint_mode)
            return
        workers = [pid for proc in started for pid in child_pids(proc.pid) if catches(pid, signal.SIGUSR1)]
        log.info("got SIGUSR1: asking workers %s to checkpoint now", workers)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)

    def dump_stacks(_signum: int, _frame: FrameType | None) -> None:
        workers = [Worker(pid, rank_of(pid)) for proc in started for pid in child_pids(proc.pid)]
        log.info("got SIGUSR2: dumping the stacks of workers %s", [w.pid for w in workers])
        where = {
            "output_dir": Path(env.get(OUTPUT_DIR_ENV) or DEFAULT_OUTPUT_DIR),
            "attempt": plan.attempt,
            "node_rank": plan.node_rank,
            "stacks_dir": stacks_dir,
            "upload": bool(plan.instance_id and env.get(OUTPUT_DIR_ENV)),  # under the bootstrap
        }
        threading.Thread(target=dump_and_upload, args=(workers,), kwargs=where, daemon=True).start()

    # Installed before the start: a signal that arrives first must not take the launcher's default action.
    signal.signal(signal.SIGTERM, forward_stop)
    signal.signal(signal.SIGINT, forward_stop)
    signal.signal(signal.SIGUSR1, forward_checkpoint)
    signal.signal(signal.SIGUSR2, dump_stacks)
    proc, torchrun_stderr = _start_torchrun(argv, child_env, stop_asked=lambda: bool(stopped))
    started.append(proc)
    if own is not None:
        own.started()
    if stopped:
        proc.send_signal(signal.SIGTERM)
    tensorboard = TensorboardUploads(dict(env))
    teardown = TeardownWatch(
        outcome_dir, expected_workers=plan.nproc_per_node, torchrun_pid=proc.pid, grace=plan.teardown_grace
    )
    while (torchrun_code := exit_code_within(proc, seconds=0.5)) is None:
        for ticking in (tensorboard, teardown):
            ticking.tick()
        notice = own.spot_notice() if own is not None else ""
        if notice and not stopped:
            stop(notice)
    torchrun_stderr.close()
    if own is not None:
        outcome = own.finish(torchrun_code=torchrun_code, stopped=bool(stopped))
    else:
        outcome = decide_exit(
            torchrun_code=torchrun_code, outcomes=read_outcomes(outcome_dir), expected_workers=plan.nproc_per_node
        )
    log.info("torchrun exited %d; %s", torchrun_code, outcome.described())
    return outcome


def _start_torchrun(
    argv: list[str], env: Mapping[str, str], *, stop_asked: Callable[[], bool]
) -> tuple[subprocess.Popen[bytes], TorchrunStderr]:
    """torchrun, started with its stderr passed through `TorchrunStderr`."""
    log.info("launching: %s", " ".join(argv))
    proc = subprocess.Popen(argv, env=dict(env), stderr=subprocess.PIPE)
    assert proc.stderr is not None
    stderr = TorchrunStderr(proc.stderr, sys.stderr.buffer, stop_asked=stop_asked)
    stderr.start()
    return proc, stderr


def prepare(plan: LaunchPlan, env: Mapping[str, str], workdir: Path) -> ScriptCheckpoints | None:
    """Before the command: the code unpacked into ``workdir``, a script's own folder restored.
    ConfigError or CheckpointError when the job cannot start as configured."""
    if plan.code_uri:
        code_archive.install(plan.code_uri, plan.code_sha256, workdir)
    if plan.checkpoint_mode == GPUJOBS:
        return None
    publisher = make_publisher(env.get("GPUJOBS_EVENT_BUS", "").strip()) if plan.node_rank == 0 else None
    return ScriptCheckpoints.open(
        plan.checkpoint_mode,
        env,
        node_rank=plan.node_rank,
        job_id=plan.job_id,
        attempt=plan.attempt,
        publisher=publisher,
    )


def exit_detail(plan: LaunchPlan, outcome: JobOutcome) -> dict[str, object]:
    """Pure: the `Job Exited` detail; `instance_id` only when the bootstrap provided one."""
    detail: dict[str, object] = {
        "job_id": plan.job_id,
        "attempt": plan.attempt,
        "node_rank": plan.node_rank,
        "exit_code": outcome.exit_code,
        "reason": outcome.reason,
    }
    if plan.instance_id:
        detail["instance_id"] = plan.instance_id
    if outcome.message:
        detail["message"] = outcome.message
    return detail


def report_exit(plan: LaunchPlan, outcome: JobOutcome, bus: str) -> None:
    if not bus:
        return
    EventBridgePublisher(bus).publish_now(JOB_EXITED, exit_detail(plan, outcome))


GPUJOBS_REFERENCE = re.compile(r"\$\{(GPUJOBS_[A-Z0-9_]+)\}")
"""`${GPUJOBS_NAME}` in an argument of the command: the only form `expand_argv` replaces."""


def expand_argv(command: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """Pure: each `${GPUJOBS_NAME}` in the command's arguments replaced by that variable's value (the
    command is argv, run without a shell: `--ckpt ${GPUJOBS_CHECKPOINT_DIR}` needs no `sh -c`).
    Nothing else is touched (`$HOME`, `${OTHER}` stay as written); ConfigError names a reference
    to a variable the job does not have."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigError(f"the command refers to ${{{name}}}, which this job does not set (docs/job-spec.md)")
        return env[name]

    return tuple(GPUJOBS_REFERENCE.sub(value, argument) for argument in command)


def split_command(argv: Sequence[str]) -> list[str]:
    """Everything after the first ``--`` is the training command."""
    args = list(argv)
    return args[args.index("--") + 1 :] if "--" in args else args


def _gpu_count(env: Mapping[str, str]) -> int:
    if env.get("GPUJOBS_NPROC_PER_NODE", "").strip():
        return 0  # not needed; importing torch costs seconds
    import torch

    return int(torch.cuda.device_count())


AWS_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")
"""Libraries whose INFO lines ("Found credentials in environment variables.", "Found endpoint for s3
via: environment_global.") are noise in a job's log: only their warnings and errors are shown."""


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="[gpujobs launch] %(levelname)s %(message)s")
    for name in AWS_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    command = split_command(sys.argv[1:] if argv is None else argv)
    if command and command[0] in {"-h", "--help"}:
        print(__doc__)
        return 0
    env = dict(os.environ)
    # "Checkpoint now" before torchrun starts has nothing to save; its default action would kill the
    # launcher in the middle of a long `requirements:` install or `setup:` (`run` installs the handler).
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        env.update(tensorboard_env(env))
        plan = plan_from_env(env, command, gpu_count=_gpu_count(env))
        own = prepare(plan, env, Path.cwd())
        check = replace(plan, rdzv_id=plan.rdzv_id + interconnect.RDZV_SUFFIX)
        if slow := interconnect.gate(env, lambda command: torchrun_argv(replace(check, command=tuple(command)))):
            log.error("%s", slow)  # the last line: the exit's message; the bootstrap reports the 123
            return SLOW_INTERCONNECT_EXIT_CODE
        env, python = dependencies.make_ready(env, Path.cwd(), setup_env=own.env if own else None)
        plan = replace(plan, command=expand_argv(plan.command, {**env, **(own.env if own else {})}))
    except (ConfigError, CheckpointError) as exc:
        log.error("%s", exc)
        return CONFIG_ERROR_EXIT_CODE
    except code_archive.CodeFetchUnavailableError as exc:  # S3 was down, not misconfigured: retry the attempt
        log.error("%s", exc)
        return CRASH_EXIT_CODE
    problem = unrunnable(plan.command, path=env.get("PATH", os.defpath))
    if problem is not None:
        code, line = problem
        log.error("%s", line)
        return code
    outcome = run(plan, env, own=own, python=python)
    if plan.instance_id and env.get(OUTPUT_DIR_ENV):  # under the bootstrap: the report may end the job at once
        uploaded = upload_and_wait(Path(env[OUTPUT_DIR_ENV]), timeout=FINAL_UPLOAD_TIMEOUT)
        log.info("output folder %s", "uploaded" if uploaded else "not uploaded in time; the bootstrap still tries")
    if regroup_may_follow(plan, outcome):
        log.info("preempted: the bootstrap reports the exit, unless the gang regroups around a replacement")
    else:
        report_exit(plan, outcome, env.get("GPUJOBS_EVENT_BUS", "").strip())
    return outcome.exit_code


def regroup_may_follow(plan: LaunchPlan, outcome: JobOutcome) -> bool:
    """Pure: this node of a gang stopped at a warning under the bootstrap, which may start it again
    in a regrouped gang (a reclaimed node replaced in place): its 75 is no exit of the node, so only
    the bootstrap reports it, once it knows the gang does not regroup."""
    return (
        outcome.exit_code == PREEMPTED_EXIT_CODE
        and plan.nnodes > 1
        and bool(plan.instance_id)
        and plan.checkpoint_mode == GPUJOBS
    )


if __name__ == "__main__":
    sys.exit(main())
