"""A DDP script written for any cluster: it knows torchrun and a checkpoint folder, nothing of gpujobs.

It saves its own `torch.save` snapshots (rank 0, written to a temporary name then renamed, the
usual pattern) every `--save-every` steps into `--checkpoint-dir` (default `$GPUJOBS_CHECKPOINT_DIR`,
the folder every cluster scheduler names somehow), resumes from the newest snapshot it finds, and
installs no signal handler: SIGTERM ends it at once, as it would most scripts. The tests run it
under `checkpoint: directory` and check that it resumes from its own snapshot.

Rank 0 prints one JSON line per event: `saved`, `resumed` and `final`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def newest_snapshot(folder: Path) -> Path | None:
    snapshots = sorted(folder.glob("snapshot-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return snapshots[-1] if snapshots else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("GPUJOBS_CHECKPOINT_DIR", "checkpoints"))
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    folder = Path(args.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)

    start = 0
    latest = newest_snapshot(folder)
    if latest is not None:
        state = torch.load(latest)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        if rank == 0:
            print(json.dumps({"event": "resumed", "step": start}), flush=True)

    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(256, 4, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True)
    for step in range(start + 1, args.steps + 1):
        batch = slice((step * 8) % 256, (step * 8) % 256 + 8)
        loss = torch.nn.functional.mse_loss(model(inputs[batch]), targets[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.save_every == 0 and rank == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            partial = folder / f"snapshot-{step}.pt.partial"
            torch.save(state, partial)
            partial.replace(folder / f"snapshot-{step}.pt")
            print(json.dumps({"event": "saved", "step": step}), flush=True)
        time.sleep(args.step_sleep)

    if rank == 0:
        print(json.dumps({"event": "final", "step": args.steps, "resumed_from": start}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
