"""The gang's all-reduce check: is the network between its nodes as fast as their type promises?

A multi-node gang whose hosts landed on a poor network path trains at a fraction of its speed and
is billed in full; its GPUs pass the node's own check (`gpujobs.instance.gpu_health`). So when the
bootstrap sets GPUJOBS_INTERCONNECT_FLOOR_GBS (multi-node gangs only: a quarter of the type's
network bandwidth in GB/s, "0" on a host without GPUs: measure and log, never judge), the launcher
runs this check (`gate`) after the code is fetched and before `requirements:`, `setup:` and the
workload, so that none of the job's own code has run: a figure measured by our module, on the
image's Python, in a folder of its own (the job's code is not on its path).

The check is its own torchrun over the job's rendezvous (its own rendezvous id) running
``python -m gpujobs_trainer.interconnect --out FILE`` on every rank: a few warm-up all-reduces,
then timed ones of one message (256 MiB on CUDA over nccl, 8 MiB on CPU over gloo: seconds),
barrier-bracketed, each rank's time the slowest rank's (all_reduce MAX), so every node computes the
same figure: nccl-tests' bus bandwidth, busbw = algbw * 2(n-1)/n with algbw = bytes / time. Each
node's local rank 0 writes it as JSON; the launcher reads it and `judge`s it. Below a floor > 0 the
launcher exits 123 (`SLOW_INTERCONNECT_EXIT_CODE`) with `judge`'s line last on its stderr, and
the control plane relaunches the gang elsewhere without spending an attempt.

A check that cannot run (torchrun fails, a peer never joins, no result written) is logged and the
workload starts: only a figure below the floor is a 123. A peer that never comes is bounded by the
static rendezvous' own timeout (600 s, as for the workload's torchrun) and, behind it,
`CHECK_TIMEOUT` on the whole check; the workload's torchrun then meets the same absent peer.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from gpujobs_trainer.errors import ConfigError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("gpujobs_trainer.interconnect")

FLOOR_ENV = "GPUJOBS_INTERCONNECT_FLOOR_GBS"
"""GB/s (decimal); set by the bootstrap for multi-node gangs only. "0": measure and log, never judge."""
INSTANCE_TYPE_ENV = "GPUJOBS_INSTANCE_TYPE"
"""The instance's type, named in the line of a gang below its floor when the container is told it."""
RDZV_SUFFIX = "-interconnect"
"""Appended to the attempt's rendezvous id: the check's torchrun is not the workload's."""
CUDA_MESSAGE_BYTES = 256 * 2**20
CPU_MESSAGE_BYTES = 8 * 2**20
WARMUP = 3
ITERATIONS = 10
CHECK_TIMEOUT = 900.0
"""Longest the whole check may take: the static rendezvous' own 600 s for a late peer, then the
measurement. Past it torchrun is stopped and the workload starts (a check that cannot run)."""
STOP_GRACE = 30.0
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One check's figure, the same on every node."""

    busbw_gbs: float
    ranks: int
    nodes: int
    bytes: int
    seconds: float
    """One all-reduce's time, the slowest rank's, averaged over the timed ones."""


def bus_bandwidth_gbs(*, nbytes: int, seconds: float, ranks: int) -> float:
    """Pure: nccl-tests' busbw in GB/s (1e9): algbw = bytes / time, times 2(n-1)/n for an all-reduce
    (the share of the message each rank sends and receives in a ring), so it reads against a link's speed."""
    return nbytes / seconds / 1e9 * 2 * (ranks - 1) / ranks


def judge(measured: Measured, floor_gbs: float, instance_type: str) -> str | None:
    """Pure: the line that sends the gang elsewhere, or None when the figure is at or above the floor
    (or the floor is 0: measured only)."""
    if floor_gbs <= 0 or measured.busbw_gbs >= floor_gbs:
        return None
    whose = f"{instance_type}'s floor" if instance_type else "the floor"
    return (
        f"all-reduce bus bandwidth {measured.busbw_gbs:.2f} GB/s across {_across(measured)} is below"
        f" {whose} of {floor_gbs:.2f} GB/s (a quarter of its network): relaunched on other hosts"
    )


def _across(measured: Measured) -> str:
    nodes = f"{measured.nodes} node" + ("s" if measured.nodes != 1 else "")
    return f"{nodes} ({measured.ranks} ranks)"


def floor_from_env(env: Mapping[str, str]) -> float | None:
    """The floor in GB/s, None when the variable is absent (no check); ConfigError naming it when its
    value is not a finite number >= 0."""
    if FLOOR_ENV not in env:
        return None
    raw = env[FLOOR_ENV]
    try:
        floor = float(raw)
    except ValueError:
        floor = math.nan
    if not math.isfinite(floor) or floor < 0:
        raise ConfigError(f"{FLOOR_ENV} must be a number of GB/s >= 0, not {raw!r}")
    return floor


def gate(
    env: Mapping[str, str], torchrun: Callable[[list[str]], list[str]], *, timeout: float = CHECK_TIMEOUT
) -> str | None:
    """The launcher's side: when the floor variable is set, run the check and judge it. Returns the
    line to exit 123 with, or None to go on (no check asked, the figure is fine, or the check could
    not run). `torchrun(command)`: the argv of a torchrun over the job's rendezvous running `command`."""
    floor = floor_from_env(env)
    if floor is None:
        return None
    with tempfile.TemporaryDirectory(prefix="gpujobs-interconnect-") as folder:
        out = Path(folder) / "result.json"
        argv = torchrun([sys.executable, "-m", "gpujobs_trainer.interconnect", "--out", str(out)])
        measured = _run_check(argv, env, cwd=Path(folder), out=out, timeout=timeout)
    if measured is None:
        return None
    verdict = judge(measured, floor, env.get(INSTANCE_TYPE_ENV, "").strip())
    if verdict is None:
        against = f"at or above the floor of {floor:.2f} GB/s" if floor > 0 else "floor 0: measured only"
        log.info(
            "all-reduce bus bandwidth %.2f GB/s across %s (%d MiB in %.1f ms): %s",
            measured.busbw_gbs,
            _across(measured),
            measured.bytes // 2**20,
            measured.seconds * 1e3,
            against,
        )
    return verdict


def _run_check(argv: list[str], env: Mapping[str, str], *, cwd: Path, out: Path, timeout: float) -> Measured | None:
    """The check's torchrun to its end (in `cwd`: the job's code is not on its path) and its figure,
    or None, logged, when it did not give one."""
    log.info("checking the gang's all-reduce bandwidth: %s", " ".join(argv))
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=dict(env), cwd=cwd)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.warning("the all-reduce check did not end within %gs: stopped; the workload starts unchecked", timeout)
        return None
    if code != 0:
        log.warning("the all-reduce check could not run (torchrun exited %d): the workload starts unchecked", code)
        return None
    try:
        measured = Measured(**json.loads(out.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as exc:
        log.warning("the all-reduce check wrote no figure (%s): the workload starts unchecked", exc)
        return None
    log.info("the all-reduce check took %.1fs", time.monotonic() - started)
    return measured


# ---- under torchrun: the measurement ----------------------------------------------------------
def start_group() -> torch.device:
    """This rank's device (LOCAL_RANK's GPU, or the CPU) and the default process group: nccl on CUDA, gloo otherwise."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return torch.device(f"cuda:{local_rank}" if cuda else "cpu")


def measure(
    device: torch.device, *, nbytes: int | None = None, warmup: int = WARMUP, iterations: int = ITERATIONS
) -> Measured:
    """All-reduces of one float32 message of `nbytes` (default by device) in the started group, timed
    between barriers; the time is the slowest rank's, so every rank returns the same figure."""
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    size = nbytes if nbytes is not None else CUDA_MESSAGE_BYTES if cuda else CPU_MESSAGE_BYTES
    tensor = torch.ones(size // 4, dtype=torch.float32, device=device)

    for _ in range(warmup):  # communicators, buffers, connections
        dist.all_reduce(tensor)
    if cuda:
        torch.cuda.synchronize(device)
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
    started = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([(time.perf_counter() - started) / iterations], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    seconds = float(elapsed.item())
    ranks = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "0")) or max(1, ranks // max(1, local))
    busbw = bus_bandwidth_gbs(nbytes=tensor.numel() * 4, seconds=seconds, ranks=ranks)
    return Measured(busbw_gbs=busbw, ranks=ranks, nodes=nodes, bytes=tensor.numel() * 4, seconds=seconds)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One rank of the gang's all-reduce check (run under torchrun).")
    parser.add_argument("--out", required=True, help="where each node's local rank 0 writes the figure (JSON)")
    parser.add_argument("--bytes", type=int, default=None, help="message size (default: 256 MiB on CUDA, 8 MiB on CPU)")
    args = parser.parse_args(argv)
    import torch.distributed as dist

    device = start_group()
    try:
        measured = measure(device, nbytes=args.bytes)
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        Path(args.out).write_text(json.dumps(asdict(measured)) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
