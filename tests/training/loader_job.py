"""A training loop as an ML engineer writes it, made resumable with gpujobs_trainer.

A shuffling ``DistributedSampler`` feeding a ``StatefulDataLoader`` with worker processes, random
augmentation in ``__getitem__`` (torch, ``random`` and numpy), BatchNorm and dropout in the model,
a GradScaler, an EMA of the weights, a best-loss tracker and a per-rank counter. Every rank writes
one line per step to ``--log-dir`` (the sample indices and a digest of the augmented batch it
trained on) and, at the end, its final state to ``--state-dump`` (one file per rank), so a test can
compare an interrupted and resumed run with an uninterrupted one batch by batch and bit by bit.

    python -m gpujobs_trainer.launch -- python loader_job.py --steps 120 --log-dir logs
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.data import Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

import gpujobs_trainer

SAMPLES = 256
FEATURES = 16
CLASSES = 4


class NoisyPoints(Dataset[tuple[torch.Tensor, int, int]]):
    """Fixed points with augmentation drawn from all three global RNGs, as real transforms do."""

    def __init__(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.points = torch.randn(SAMPLES, FEATURES, generator=generator)
        self.labels = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        x = self.points[index] + 0.1 * torch.randn(FEATURES)
        if random.random() < 0.5:
            x = x.flip(0)
        x = x * float(np.random.uniform(0.9, 1.1))
        return x, int(self.labels[index]), index


class BestLoss:
    """Best all-reduced loss so far: the same on every rank, so shared state."""

    def __init__(self) -> None:
        self.best = float("inf")
        self.at_step = -1

    def update(self, loss: float, step: int) -> None:
        if loss < self.best:
            self.best, self.at_step = loss, step

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "at_step": self.at_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.at_step = float(state["best"]), int(state["at_step"])


class SampleCounter:
    """How many samples this rank has trained on, and the sum of their indices: per-rank state."""

    def __init__(self) -> None:
        self.count = 0
        self.index_sum = 0

    def add(self, indices: torch.Tensor) -> None:
        self.count += len(indices)
        self.index_sum += int(indices.sum())

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "index_sum": self.index_sum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.index_sum = int(state["count"]), int(state["index_sum"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=4, help="per-rank batch size")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--state-dump", default="", help="each rank torch.saves its final state to PREFIX.rankN.pt")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    env = gpujobs_trainer.setup_distributed()
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    net = nn.Sequential(nn.Linear(FEATURES, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, CLASSES))
    model = gpujobs_trainer.prepare_model(net)
    ema = copy.deepcopy(net)
    torch.manual_seed(args.seed + 1000 * env.rank)  # per-rank dropout streams
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=25, gamma=0.7)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=10)
    best, seen = BestLoss(), SampleCounter()

    data = gpujobs_trainer.SeededSamples(NoisyPoints(args.seed), seed=args.seed)
    sampler: DistributedSampler[int] = DistributedSampler(data, shuffle=True, seed=args.seed, drop_last=True)
    loader = StatefulDataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers)

    run = gpujobs_trainer.init(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state={"scaler": scaler, "ema": ema, "best": best, "loader": loader, "seen": gpujobs_trainer.per_rank(seen)},
    )
    start = run.resume()
    log_path = Path(args.log_dir) / f"rank{env.rank}.jsonl"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    step, epoch = start.step, start.epoch
    with log_path.open("a", encoding="utf-8") as batch_log:
        while step < args.steps and not run.preempted:
            sampler.set_epoch(epoch)
            data.set_epoch(epoch)
            for x, y, indices in loader:
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                with torch.no_grad():
                    for averaged, live in zip(ema.parameters(), net.parameters(), strict=True):
                        averaged.lerp_(live, 0.1)
                    mean_loss = loss.detach().clone()
                    dist.all_reduce(mean_loss)
                best.update(float(mean_loss) / env.world_size, step)
                seen.add(indices)
                step += 1
                digest = hashlib.sha256(x.numpy().tobytes()).hexdigest()
                batch_log.write(json.dumps({"step": step, "indices": indices.tolist(), "batch": digest}) + "\n")
                batch_log.flush()
                if env.is_main and step % 10 == 0:
                    print(f"[loader-job] step {step}/{args.steps} epoch {epoch}", flush=True)
                time.sleep(args.step_sleep)
                if run.step_done(step, epoch=epoch) or step >= args.steps:
                    break
            else:
                epoch += 1
    if args.state_dump and not run.preempted:
        torch.save(
            {
                "model": net.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "ema": ema.state_dict(),
                "best": best.state_dict(),
                "seen": seen.state_dict(),
            },
            f"{args.state_dump}.rank{env.rank}.pt",
        )
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
