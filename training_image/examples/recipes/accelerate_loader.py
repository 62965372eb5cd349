"""Recipe: a Hugging Face Accelerate loop over a prepared, shuffling DataLoader with workers (Accelerate 1.15).

The loop is the one the Accelerate docs teach: ``accelerator.prepare(model, optimizer, loader,
scheduler)``, ``for x, y in loader``, ``accelerator.backward(loss)``. Ported to gpujobs it changes
in four places (docs/training.md, "Porting an Accelerate loop"):

1. ``DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=True)``: the loader
   has a position to save, and each epoch's shuffle is seeded from (seed, epoch), so a resumed run
   sees the batches it would have seen (the trainer refuses a prepared loader without them).
2. ``gpujobs_trainer.init`` gets the plain objects underneath (``unwrap_model``,
   ``optimizer.optimizer``, ``scheduler.scheduler``) and the prepared loader as ``state``: the
   trainer saves its position per rank and shields its workers from torchrun's SIGTERM.
3. ``loader.set_epoch(epoch)`` before each epoch, from the epoch the checkpoint restores.
4. ``run.step_done(step, epoch=epoch)`` after each step, and ``run.finish()`` before
   ``accelerator.end_training()`` (which destroys the process group the last save needs).

    python -m gpujobs_trainer.launch -- python training_image/examples/recipes/accelerate_loader.py --steps 60
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F  # noqa: N812
from accelerate import Accelerator, DataLoaderConfiguration
from common import Batches, dump_state, emit, make_model, make_optimizer, parse_args
from torch.utils.data import DataLoader

import gpujobs_trainer


def main() -> int:
    args = parse_args(__doc__ or "")
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=True),
    )
    model = make_model(args.seed)
    optimizer, scheduler = make_optimizer(model, args.lr, args.steps)
    dataset = Batches(seed=args.seed, batch_size=args.batch_size, device=accelerator.device).data
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=2, drop_last=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    run = gpujobs_trainer.init(
        model=accelerator.unwrap_model(model),
        optimizer=optimizer.optimizer,
        scheduler=scheduler.scheduler,
        state={"loader": loader},
    )
    start = run.resume()
    step, epoch = start.step, start.epoch
    emit("resumed", step=step)
    while step < args.steps and not run.preempted:
        loader.set_epoch(epoch)
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            step += 1
            emit("loss", step=step, loss=loss.item())
            time.sleep(args.step_sleep)
            if run.step_done(step, epoch=epoch) or step >= args.steps:
                break
        else:
            epoch += 1
    if not run.preempted:
        dump_state(accelerator.unwrap_model(model), optimizer.optimizer, scheduler.scheduler, args.state_dump)
    code = run.finish()
    accelerator.end_training()
    return code


if __name__ == "__main__":
    sys.exit(main())
