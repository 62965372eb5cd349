"""Process-group setup from the torchrun environment, and the device-specific knobs.

NCCL on GPU, gloo on CPU, and a short collective timeout: with the 10-30 minute defaults a
vanished peer (a reclaimed spot instance) would stall the survivors for that long; failing fast
lets the control plane restart the whole job from the last checkpoint instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpujobs_trainer.errors import ConfigError

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_process_group_from_env(*, timeout_seconds: float | None = None) -> DistEnv:
    """Initialise the default process group once (idempotent) and return this rank's place."""
    missing = [name for name in _TORCHRUN_VARS if name not in os.environ]
    if missing:
        raise ConfigError(
            f"torchrun environment missing ({', '.join(missing)}): start the script through "
            "`python -m gpujobs_trainer.launch -- ...` or torchrun"
        )
    if timeout_seconds is None:
        timeout_seconds = float(os.environ.get("GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS", "120") or 120)
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_seconds))
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=device)


def current_env() -> DistEnv:
    return init_process_group_from_env()


def prepare_model(model: nn.Module, *, compile_model: bool | None = None) -> nn.Module:
    """Move the model to this rank's device, wrap it in DDP and optionally torch.compile it."""
    env = current_env()
    model = model.to(env.device)
    ddp = DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    if compile_model is None:
        compile_model = os.environ.get("GPUJOBS_COMPILE", "0").strip().lower() in {"1", "true", "yes", "on"}
    if compile_model:
        compiled: nn.Module = torch.compile(ddp)  # type: ignore[assignment]
        return compiled
    return ddp


@contextlib.contextmanager
def autocast(device: torch.device) -> Iterator[None]:
    """bf16 autocast on GPU; plain fp32 on CPU (exact, and what the CPU tests compare bit for bit)."""
    if device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        yield


def all_reduce_max(values: list[int], device: torch.device) -> list[int]:
    """Element-wise maximum of small integer flags over all ranks (one collective)."""
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]
