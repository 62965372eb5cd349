"""Recipe: a plain PyTorch DDP script that sets up its own process group, ported to gpujobs.

The script keeps its ``init_process_group`` (and so its own timeout for its collectives) and its
own ``DistributedDataParallel``; it hands the DDP model, the optimizer and the scheduler to
``gpujobs_trainer.init`` and reports each step with ``run.step_done``. docs/training.md walks
through the port line by line.

    python -m gpujobs_trainer.launch -- python training_image/examples/recipes/ddp.py --steps 60
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from common import Batches, dump_state, make_model, make_optimizer, parse_args, train
from torch.nn.parallel import DistributedDataParallel

import gpujobs_trainer


def main() -> int:
    args = parse_args(__doc__ or "")
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    model = DistributedDataParallel(
        make_model(args.seed).to(device), device_ids=[local_rank] if device.type == "cuda" else None
    )
    optimizer, scheduler = make_optimizer(model, args.lr, args.steps)

    run = gpujobs_trainer.init(model=model, optimizer=optimizer, scheduler=scheduler)
    batches = Batches(seed=args.seed, batch_size=args.batch_size, device=device)
    train(run, model=model, optimizer=optimizer, scheduler=scheduler, batches=batches, args=args)
    if not run.preempted:
        dump_state(model, optimizer, scheduler, args.state_dump)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
