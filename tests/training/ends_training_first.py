"""A training script that tears the process group down before ``run.finish()``, as a loop that ends
with Accelerate's ``accelerator.end_training()`` does: ``python ends_training_first.py STEPS``."""

from __future__ import annotations

import json
import sys

import torch
from accelerate import Accelerator

import gpujobs_trainer


def main() -> int:
    steps = int(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    plain = torch.nn.Linear(8, 2)
    model, optimizer = accelerator.prepare(plain, torch.optim.AdamW(plain.parameters()))
    run = gpujobs_trainer.init(model=accelerator.unwrap_model(model), optimizer=optimizer.optimizer)
    start = run.resume()
    if run.env.is_main:
        print(json.dumps({"event": "resumed", "step": start.step, "skipped": list(start.skipped)}), flush=True)
    for step in range(start.step + 1, steps + 1):
        accelerator.backward(model(torch.randn(4, 8)).square().mean())
        optimizer.step()
        optimizer.zero_grad()
        if run.step_done(step):
            break
    accelerator.end_training()  # destroys the process group
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
