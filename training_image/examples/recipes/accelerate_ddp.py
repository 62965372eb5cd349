"""Recipe: a Hugging Face Accelerate loop with gpujobs (Accelerate 1.15).

Accelerate wraps what it prepares: the model in DDP, the optimizer in ``AcceleratedOptimizer``
(which subclasses ``torch.optim.Optimizer`` but never runs its ``__init__``, so it cannot take the
step hook the trainer's asynchronous saves use) and the scheduler in ``AcceleratedScheduler``. The
trainer gets what is underneath: ``accelerator.unwrap_model(model)``, ``optimizer.optimizer`` and
``scheduler.scheduler``. The loop keeps using the wrapped objects and ``accelerator.backward``.
``accelerator.save_state``/``load_state`` are not used: the trainer's checkpoint replaces them.

    python -m gpujobs_trainer.launch -- python training_image/examples/recipes/accelerate_ddp.py --steps 60
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from common import Batches, dump_state, make_model, make_optimizer, parse_args, train

import gpujobs_trainer


def main() -> int:
    args = parse_args(__doc__ or "")
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model = make_model(args.seed)
    optimizer, scheduler = make_optimizer(model, args.lr, args.steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    run = gpujobs_trainer.init(
        model=accelerator.unwrap_model(model), optimizer=optimizer.optimizer, scheduler=scheduler.scheduler
    )
    batches = Batches(seed=args.seed, batch_size=args.batch_size, device=accelerator.device)
    train(
        run,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        batches=batches,
        args=args,
        backward=accelerator.backward,
    )
    if not run.preempted:
        dump_state(accelerator.unwrap_model(model), optimizer.optimizer, scheduler.scheduler, args.state_dump)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
