"""Handwritten-digit classifier trained with DDP: the example job of gpujobs.

The data is scikit-learn's bundled ``load_digits`` (1797 8x8 images inside the wheel; nothing is
downloaded): the first 1500 images train, the last 297 are held out. It reaches >= 0.9 held-out
accuracy in a few hundred steps on two CPU processes, survives interruption at any step and
resumes bit-exactly (model, optimizer, LR schedule, RNG and the position inside the epoch).

    python -m gpujobs_trainer.launch -- python train.py --steps 400
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F  # noqa: N812
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DistributedSampler

import gpujobs_trainer


class DigitsNet(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # type: ignore[no-any-return]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="total optimizer steps (default 400)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--log-every", type=int, default=50, help="print a progress line every N steps")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (demos)")
    parser.add_argument(
        "--checkpoint-every-steps", type=int, default=None, help="overrides GPUJOBS_CHECKPOINT_EVERY_STEPS"
    )
    parser.add_argument(
        "--export", action="store_true", help="at the end, write model.safetensors to the job's output folder"
    )
    parser.add_argument("--state-dump", default="", help="rank 0 torch.saves final model+optimizer state here")
    return parser.parse_args(argv)


def emit(record: dict[str, object]) -> None:
    """A machine-readable line on stdout (and in GPUJOBS_RESULT_FILE for the final result)."""
    line = json.dumps(record)
    sys.stdout.write(line + "\n")  # one write: other ranks share the stream
    sys.stdout.flush()
    result_file = os.environ.get("GPUJOBS_RESULT_FILE", "")
    if record.get("event") == "final" and result_file:
        with open(result_file, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deterministic split: first 1500 images train, last 297 are held out."""
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images / 16.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.long)
    return x[:1500], y[:1500], x[1500:], y[1500:]


def train(
    *,
    args: argparse.Namespace,
    run: gpujobs_trainer.Run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    data: tuple[torch.Tensor, torch.Tensor],
    start: gpujobs_trainer.ResumePoint,
) -> int:
    """The loop: batches come from (epoch, offset), so a resume continues mid-epoch exactly."""
    x_train, y_train = data
    indices: list[int] = list(range(len(x_train)))
    sampler: DistributedSampler[int] = DistributedSampler(indices, seed=args.seed, drop_last=True)  # type: ignore[arg-type]
    step, epoch, offset = start.step, start.epoch, start.offset
    began = time.monotonic()
    while step < args.steps:
        sampler.set_epoch(epoch)
        order = list(sampler)
        batches = len(order) // args.batch_size
        while offset < batches and step < args.steps:
            batch = torch.tensor(order[offset * args.batch_size : (offset + 1) * args.batch_size])
            model.train()
            with run.autocast():
                loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            scheduler.step()
            step, offset = step + 1, offset + 1
            end_of_epoch = offset == batches
            if end_of_epoch:  # the position to continue from is the start of the next epoch
                epoch, offset = epoch + 1, 0
            if run.env.is_main and (step % args.log_every == 0 or step == args.steps):
                rate = (step - start.step) / max(time.monotonic() - began, 1e-9)
                print(
                    f"[digits] step {step:>5}/{args.steps}  epoch {epoch:>3}  loss {loss.item():.4f}"
                    f"  ({rate:.1f} steps/s)",
                    flush=True,
                )
            if args.step_sleep:
                time.sleep(args.step_sleep)
            # rank 0's heartbeats carry these (gpujobs status / metrics); the tensor is read only then
            if run.step_done(
                step, epoch=epoch, offset=offset, metrics={"loss": loss, "lr": scheduler.get_last_lr()[0]}
            ):
                return step
            if end_of_epoch:
                break
    return step


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.checkpoint_every_steps is not None:
        os.environ["GPUJOBS_CHECKPOINT_EVERY_STEPS"] = str(args.checkpoint_every_steps)
    x_train, y_train, x_test, y_test = load_data()

    env = gpujobs_trainer.setup_distributed()
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    net = DigitsNet(args.hidden)
    model = gpujobs_trainer.prepare_model(net)
    torch.manual_seed(args.seed + 1000 * env.rank)  # per-rank dropout streams (saved per rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps, eta_min=args.lr / 20)
    run = gpujobs_trainer.init(
        model=model, optimizer=optimizer, scheduler=scheduler, samples_per_step=args.batch_size * env.world_size
    )
    start = run.resume()
    if env.is_main:
        emit(
            {
                "event": "resumed",
                "step": start.step,
                "epoch": start.epoch,
                "offset": start.offset,
                "skipped": list(start.skipped),
            }
        )

    step = train(
        args=args,
        run=run,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        data=(x_train.to(env.device), y_train.to(env.device)),
        start=start,
    )

    if args.export and not run.preempted:
        run.export(model)  # every rank takes part; rank 0 writes $GPUJOBS_OUTPUT_DIR/model.safetensors
    if env.is_main and not run.preempted:
        net.eval()
        with run.busy("eval"), torch.no_grad():  # a long evaluation is not taken for a hang
            predictions = net(x_test.to(env.device)).argmax(dim=1).cpu()
        accuracy = float((predictions == y_test).float().mean())
        emit({"event": "final", "step": step, "accuracy": round(accuracy, 4), "resumed_from": start.step})
        if args.state_dump:
            torch.save(
                {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                args.state_dump,
            )
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
