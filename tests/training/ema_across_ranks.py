"""A DDP script with a BatchNorm model and an EMA of it, each rank on its own data:
``python ema_across_ranks.py STEPS {shared,per-rank,layernorm}``.

- ``shared``: ``AveragedModel(use_buffers=True)`` given as shared state. Each rank averages its own
  BatchNorm statistics, so the EMA differs across ranks: the first save must refuse it.
- ``per-rank``: the same EMA wrapped in ``per_rank()``: saved per rank, training goes on.
- ``layernorm``: the same EMA of a model with LayerNorm instead (no running statistics, as in a
  transformer): it averages DDP-synchronised parameters only, so it is the same on every rank and
  is saved as shared state without complaint. (``use_buffers=False`` would not do: torch then
  copies each rank's own buffers into the EMA at every update.)
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import gpujobs_trainer


def main() -> int:
    steps, mode = int(sys.argv[1]), sys.argv[2]
    env = gpujobs_trainer.setup_distributed()
    torch.manual_seed(0)
    norm = nn.LayerNorm(8) if mode == "layernorm" else nn.BatchNorm1d(8)
    plain = nn.Sequential(nn.Linear(8, 8), norm, nn.ReLU(), nn.Linear(8, 2))
    ema = AveragedModel(plain, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    model = DistributedDataParallel(plain)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = gpujobs_trainer.init(
        model=model, optimizer=optimizer, state={"ema": gpujobs_trainer.per_rank(ema) if mode == "per-rank" else ema}
    )
    start = run.resume()
    data = torch.Generator().manual_seed(100 + env.rank)  # each rank its own batches
    for step in range(start.step + 1, steps + 1):
        model(torch.randn(16, 8, generator=data)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        ema.update_parameters(plain)
        if run.step_done(step):
            break
    if env.is_main:
        print(json.dumps({"event": "final", "step": run.step}), flush=True)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
