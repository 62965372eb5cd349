"""What the framework recipes share: a small regression task, its training loop, and the lines a
test reads. Each recipe (``ddp.py``, ``fsdp2.py``, ``accelerate_ddp.py``) only sets up its
framework and hands the trainer the plain model, optimizer and scheduler underneath it.

The loop is the one ``gpujobs_trainer`` asks for: batches are addressed by ``(epoch, offset)``
through a ``DistributedSampler`` with a fixed seed, so the position saved at ``step_done`` is
enough to resume at the exact next batch; dropout draws from the RNG the checkpoint restores.
It prints one JSON line per step on rank 0 (``{"event": "loss", ...}``), so a test can compare an
interrupted and resumed run with an uninterrupted one loss by loss.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.utils.data import DistributedSampler, TensorDataset

import gpujobs_trainer

FEATURES = 16
SAMPLES = 1024


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=60, help="total optimizer steps")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=16, help="per-rank batch size")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (tests)")
    parser.add_argument("--state-dump", default="", help="rank 0 torch.saves the final full state here")
    return parser.parse_args()


def make_model(seed: int) -> nn.Module:
    """The same initial weights on every rank (DDP would broadcast rank 0's anyway; FSDP2 does not)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))


def make_optimizer(model: nn.Module, lr: float, steps: int) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)


class Batches:
    """Batch ``offset`` of epoch ``epoch`` on this rank, the same wherever the run restarts."""

    def __init__(self, *, seed: int, batch_size: int, device: torch.device) -> None:
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(SAMPLES, FEATURES, generator=generator)
        y = x @ torch.randn(FEATURES, 1, generator=generator) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
        self.data = TensorDataset(x, y)
        self.sampler = DistributedSampler(self.data, shuffle=True, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.per_epoch = len(self.sampler) // batch_size
        self.device = device

    def get(self, epoch: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.sampler.set_epoch(epoch)
        indices = list(self.sampler)[offset * self.batch_size : (offset + 1) * self.batch_size]
        x, y = self.data[indices]
        return x.to(self.device), y.to(self.device)


def train(
    run: gpujobs_trainer.Run,
    *,
    model: nn.Module,
    optimizer: Any,
    scheduler: Any,
    batches: Batches,
    args: argparse.Namespace,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
) -> None:
    """Train to ``args.steps`` from wherever the checkpoint left off; stop when told to."""
    start = run.resume()
    step, epoch, offset = start.step, start.epoch, start.offset
    emit("resumed", step=step)
    while step < args.steps:
        if offset >= batches.per_epoch:
            epoch, offset = epoch + 1, 0
        x, y = batches.get(epoch, offset)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        backward(loss)
        optimizer.step()
        scheduler.step()
        step, offset = step + 1, offset + 1
        emit("loss", step=step, loss=loss.item())
        time.sleep(args.step_sleep)
        if run.step_done(step, epoch=epoch, offset=offset):
            return  # preempted: the checkpoint is committed


def dump_state(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, path: str) -> None:
    """Rank 0 saves the full (unsharded) model, optimizer and schedule; every rank must call it."""
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=full)
    if path and dist.get_rank() == 0:
        torch.save({"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict()}, path)


def emit(event: str, **fields: object) -> None:
    if dist.get_rank() == 0:
        print(json.dumps({"event": event, **fields}), flush=True)
