"""Recipe: a Hugging Face ``Trainer`` job under ``checkpoint: directory`` (transformers 5.25).

The Trainer keeps its own loop and its own checkpoints (``checkpoint-<step>/``: weights, optimizer,
scheduler, every rank's RNG state, the trainer state), so the trainer library stays out of it: the
job runs under the spec's ``checkpoint: directory``, the Trainer saves into
``$GPUJOBS_CHECKPOINT_DIR`` (node 0's folder is kept in S3 as it runs and restored on the next
attempt), and resumes with ``trainer.train(resume_from_checkpoint=...)``.

One thing the Trainer does not do: save when it is stopped. The launcher turns the spot notice into
SIGTERM for the workers; without a handler that kills them, and everything since the last
``save_steps`` is lost. `SaveOnPreemption` is that handler, as a ``TrainerCallback``: SIGTERM sets a
flag, and at the end of each step the ranks agree (one all-reduce of one number) to save a
checkpoint of that step and stop. The launcher then syncs the folder and exits 75 ("resume me").
Ported from the usual script, the lines that change are marked ``# gpujobs``.

    python -m gpujobs_trainer.launch -- python training_image/examples/recipes/hf_trainer.py --steps 60
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from common import Batches, make_model, parse_args
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Regression(nn.Module):
    """The recipes' small regression model, in the Trainer's calling convention (``labels`` in, ``loss`` out)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.net = make_model(seed)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.net(x)
        return {"loss": F.mse_loss(out, labels), "logits": out}


class Samples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, seed: int) -> None:
        self.data = Batches(seed=seed, batch_size=1, device=torch.device("cpu")).data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x, y = self.data[index]
        return {"x": x, "labels": y}


class SaveOnPreemption(TrainerCallback):  # gpujobs
    """SIGTERM (the launcher's spot notice, or any stop) -> save this step's checkpoint, then stop."""

    def __init__(self) -> None:
        self.stopping = False

    def on_train_begin(self, *_: Any, **__: Any) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **_: Any) -> None:
        flag = torch.tensor([1.0 if self.stopping else 0.0], device=args.device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if flag.item() > 0:
            control.should_save = True
            control.should_training_stop = True
            if state.is_world_process_zero:
                print(json.dumps({"event": "preempted", "step": state.global_step}), flush=True)


class PrintLosses(TrainerCallback):
    """One JSON line per logged step on rank 0, for the test (and a slow step, for its --step-sleep)."""

    def __init__(self, step_sleep: float) -> None:
        self.step_sleep = step_sleep

    def on_step_end(self, *_: Any, **__: Any) -> None:
        time.sleep(self.step_sleep)

    def on_log(self, _args: TrainingArguments, state: Any, _control: Any, logs: Any = None, **_: Any) -> None:
        if state.is_world_process_zero and logs and "loss" in logs:
            print(json.dumps({"event": "loss", "step": state.global_step, "loss": logs["loss"]}), flush=True)


def main() -> int:
    args = parse_args(__doc__ or "")
    folder = os.environ.get("GPUJOBS_CHECKPOINT_DIR", "checkpoints")  # gpujobs
    training = TrainingArguments(
        output_dir=folder,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        seed=args.seed,
        data_seed=args.seed,
        save_strategy="steps",
        save_steps=10,
        save_total_limit=2,
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        ddp_backend="nccl" if torch.cuda.is_available() else "gloo",
    )
    model = Regression(args.seed)
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Samples(args.seed),
        callbacks=[SaveOnPreemption(), PrintLosses(args.step_sleep)],  # gpujobs
    )
    last = get_last_checkpoint(folder) if Path(folder).is_dir() else None  # gpujobs
    if trainer.is_world_process_zero():
        print(json.dumps({"event": "resumed", "step": int(last.rsplit("-", 1)[1]) if last else 0}), flush=True)
    trainer.train(resume_from_checkpoint=last)  # gpujobs: resume_from_checkpoint
    preempted = trainer.state.global_step < args.steps
    if args.state_dump and not preempted and trainer.is_world_process_zero():
        assert trainer.optimizer is not None
        assert trainer.lr_scheduler is not None
        final = {
            "model": model.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.lr_scheduler.state_dict(),
        }
        torch.save(final, args.state_dump)
    return 0


if __name__ == "__main__":
    code = main()
    # gpujobs: leave without torch's teardown. The Trainer never destroys its process group, and
    # freeing one at exit races its own threads (a gloo thread freeing a finished collective's
    # tensors needs the GIL the exiting main thread holds): the process may hang or abort
    # ("terminate called without an active exception") after a finished run, and torchrun then
    # reports a crash. Everything is saved and closed by now; flush and exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
