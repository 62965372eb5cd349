"""``python -m gpujobs_trainer.launch -- <command...>``: the container's entrypoint.

Reads the bootstrap's environment, runs torchrun (static rendezvous at the rank-0 node's private
IP, a fresh rendezvous id per attempt, no in-place restarts: the control plane replaces whole
instances and the job resumes from its checkpoint), forwards signals and maps the outcome to one
exit code: 0 succeeded, 75 preempted with a committed checkpoint, 78 configuration error (also a
program or `python` script that is not there, checked before torchrun hides why), 1 anything else.

Signals: SIGTERM/SIGINT go to torchrun, which forwards SIGTERM to the workers and waits
``GPUJOBS_SHUTDOWN_TIMEOUT`` seconds before SIGKILL. SIGUSR1 ("checkpoint now, keep training")
cannot go through torchrun: torchrun treats every signal it handles as a reason to shut down.
So the launcher sends SIGUSR1 straight to torchrun's worker processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gpujobs_trainer.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
from gpujobs_trainer.events import JOB_EXITED, EventBridgePublisher
from gpujobs_trainer.outcome import JobOutcome, decide_exit, read_outcomes
from gpujobs_trainer.preflight import command_problem

log = logging.getLogger("gpujobs_trainer.launch")

DEFAULT_MASTER_PORT = 29500
DEFAULT_SHUTDOWN_TIMEOUT = 90


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    rdzv_id: str
    shutdown_timeout: int
    command: tuple[str, ...]
    job_id: str
    attempt: int
    instance_id: str = ""
    """GPUJOBS_INSTANCE_ID (set by the instance bootstrap); the control plane keys exit codes by it."""


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
        command=tuple(command),
        job_id=job_id,
        attempt=attempt,
        instance_id=env.get("GPUJOBS_INSTANCE_ID", "").strip(),
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


def child_pids(parent: int, proc_root: Path = Path("/proc")) -> list[int]:
    """Direct children of ``parent`` (torchrun's workers), read from /proc."""
    children = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Format: "pid (comm) state ppid ..."; comm may contain spaces, so split after ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            children.append(int(entry.name))
    return children


def run(plan: LaunchPlan, env: Mapping[str, str]) -> JobOutcome:
    outcome_dir = Path(tempfile.mkdtemp(prefix="gpujobs-outcome-"))
    child_env = {**env, "GPUJOBS_OUTCOME_DIR": str(outcome_dir), "GPUJOBS_NODE_RANK": str(plan.node_rank)}
    argv = torchrun_argv(plan)
    log.info("launching: %s", " ".join(argv))
    proc = subprocess.Popen(argv, env=child_env)

    def forward_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("got %s: asking workers to checkpoint and stop", signal.Signals(signum).name)
        proc.send_signal(signal.SIGTERM)

    def forward_checkpoint(_signum: int, _frame: FrameType | None) -> None:
        workers = child_pids(proc.pid)
        log.info("got SIGUSR1: asking workers %s to checkpoint now", workers)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)

    signal.signal(signal.SIGTERM, forward_stop)
    signal.signal(signal.SIGINT, forward_stop)
    signal.signal(signal.SIGUSR1, forward_checkpoint)
    torchrun_code = proc.wait()
    outcome = decide_exit(
        torchrun_code=torchrun_code, outcomes=read_outcomes(outcome_dir), expected_workers=plan.nproc_per_node
    )
    log.info("torchrun exited %d; job outcome: %s (exit %d)", torchrun_code, outcome.reason, outcome.exit_code)
    return outcome


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


def split_command(argv: Sequence[str]) -> list[str]:
    """Everything after the first ``--`` is the training command."""
    args = list(argv)
    return args[args.index("--") + 1 :] if "--" in args else args


def _gpu_count(env: Mapping[str, str]) -> int:
    if env.get("GPUJOBS_NPROC_PER_NODE", "").strip():
        return 0  # not needed; importing torch costs seconds
    import torch

    return int(torch.cuda.device_count())


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[gpujobs launch] %(levelname)s %(message)s")
    command = split_command(sys.argv[1:] if argv is None else argv)
    if command and command[0] in {"-h", "--help"}:
        print(__doc__)
        return 0
    env = dict(os.environ)
    try:
        plan = plan_from_env(env, command, gpu_count=_gpu_count(env))
    except ConfigError as exc:
        log.error("%s", exc)
        return CONFIG_ERROR_EXIT_CODE
    problem = command_problem(plan.command)  # torchrun would turn these into an anonymous crash
    if problem is not None:
        log.error("%s", problem)
        outcome = JobOutcome(CONFIG_ERROR_EXIT_CODE, "config-error", problem)
    else:
        outcome = run(plan, env)
    report_exit(plan, outcome, env.get("GPUJOBS_EVENT_BUS", "").strip())
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
