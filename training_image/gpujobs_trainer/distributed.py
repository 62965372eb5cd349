"""Process-group setup from the torchrun environment, and the device-specific knobs.

NCCL on GPU, gloo on CPU. The default group, which carries the script's own collectives (DDP's
all-reduces, FSDP's all-gathers, an evaluation's reductions), keeps torch's default timeout, or
whatever the script chose by initialising it first: a short timeout there would end, not just
fail, a legitimately long collective (NCCL's watchdog kills the process under torchrun).

The trainer's own collectives (the step-boundary agreement and the final barrier) run on a separate
gloo group and each waits at most the job's collective timeout (`GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS`, the spec's
`trainer.collective_timeout_seconds`): a gloo timeout is an exception in the caller, so a rank
whose peers never reach the step boundary fails within that time instead of waiting for torch's
10 to 30 minutes, and the control plane restarts the job from its last checkpoint.
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

from gpujobs_trainer.config import compile_requested
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


def init_process_group_from_env() -> DistEnv:
    """Initialise the default process group once (idempotent) and return this rank's place."""
    missing = [name for name in _TORCHRUN_VARS if name not in os.environ]
    if missing:
        raise ConfigError(
            f"torchrun environment missing ({', '.join(missing)}): start the script through "
            "`python -m gpujobs_trainer.launch -- ...` or torchrun"
        )
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=device)


def current_env() -> DistEnv:
    return init_process_group_from_env()


def prepare_model(model: nn.Module, *, compile_model: bool | None = None) -> nn.Module:
    """Move the model to this rank's device, wrap it in DDP and optionally torch.compile it."""
    env = current_env()
    model = model.to(env.device)
    ddp = DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    if compile_model is None:
        compile_model = compile_requested()
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


class ControlGroup:
    """The trainer's own gloo group; each of its collectives gives up after ``timeout_seconds``.

    The group itself is created with torch's default timeout, because creating a gloo group waits
    for every rank to connect: ranks that reach ``init`` minutes apart (one builds its model or
    reads its data longer) must still join it. The job's timeout bounds each collective instead; a
    gloo wait that times out raises in the caller, and the attempt ends. Every rank creates the
    group once, in the same order as its other groups (``new_group`` is collective).
    """

    def __init__(self, timeout_seconds: float) -> None:
        self.group = dist.new_group(backend="gloo")
        self.timeout = timedelta(seconds=timeout_seconds)

    def all_reduce_max(self, values: list[int]) -> list[int]:
        """Element-wise maximum of small integer flags over all ranks (one collective)."""
        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True).wait(timeout=self.timeout)
        return [int(v) for v in tensor.tolist()]

    def barrier(self) -> None:
        dist.barrier(group=self.group, timeout=self.timeout)
