"""Recipe: FSDP2 (``fully_shard``) with gpujobs: parameters and optimizer state are sharded.

The trainer checkpoints through ``get_state_dict``/``set_state_dict`` and DCP, so every rank saves
and restores its own shards; nothing is gathered on rank 0. On CPU the shards live on a gloo mesh.

    python -m gpujobs_trainer.launch -- python training_image/examples/recipes/fsdp2.py --steps 60
"""

from __future__ import annotations

import sys

from common import Batches, dump_state, make_model, make_optimizer, parse_args, train
from torch import nn
from torch.distributed.fsdp import fully_shard

import gpujobs_trainer


def main() -> int:
    args = parse_args(__doc__ or "")
    env = gpujobs_trainer.setup_distributed()
    model = make_model(args.seed).to(env.device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer, scheduler = make_optimizer(model, args.lr, args.steps)

    run = gpujobs_trainer.init(model=model, optimizer=optimizer, scheduler=scheduler)
    batches = Batches(seed=args.seed, batch_size=args.batch_size, device=env.device)
    train(run, model=model, optimizer=optimizer, scheduler=scheduler, batches=batches, args=args)
    if not run.preempted:
        dump_state(model, optimizer, scheduler, args.state_dump)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
