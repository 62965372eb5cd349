"""GPU smoke benchmark for a machine with CUDA (runs in well under 5 minutes).

Measures bf16 DDP step throughput and gpujobs_trainer checkpoint save/restore times on every
visible GPU, then prints a results table. Without CUDA it exits with code 2 and says so.

    torchrun --standalone --nproc-per-node $(nvidia-smi -L | wc -l) bench/gpu_check.py
    python bench/gpu_check.py            # one GPU, no torchrun needed
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NO_CUDA_EXIT_CODE = 2


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=8192, help="hidden width of the MLP")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="per-GPU batch (rows of width)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--checkpoint-dir", default="", help="default: a temp dir")
    parser.add_argument("--json", default="", help="also write results here (rank 0)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine; run it on a GPU instance.", file=sys.stderr)
        return NO_CUDA_EXIT_CODE
    if "RANK" not in os.environ:  # plain `python bench/gpu_check.py`: a world of one
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(
            {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        )

    from torch import nn

    import gpujobs_trainer
    from gpujobs_trainer.config import TrainerConfig

    env = gpujobs_trainer.setup_distributed()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = gpujobs_trainer.prepare_model(nn.Sequential(*layers))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    with tempfile.TemporaryDirectory(dir=args.checkpoint_dir or None) as tmp:
        uri = args.checkpoint_dir or tmp
        run = gpujobs_trainer.init(
            model=model,
            optimizer=optimizer,
            samples_per_step=args.batch * env.world_size,
            config=TrainerConfig.from_env({"GPUJOBS_CHECKPOINT_URI": uri, "GPUJOBS_IMDS": "off"}),
        )
        results = measure(args, run, model, optimizer)
        run.finish()
    if env.is_main:
        width = max(len(k) for k in results)
        for key, value in results.items():
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            print(f"{key:<{width}}  {shown}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def measure(args: argparse.Namespace, run: Any, model: Any, optimizer: Any) -> dict[str, Any]:
    import torch

    env = run.env
    x = torch.randn(args.batch, args.width, device=env.device)

    def step() -> None:
        with run.autocast():
            loss = model(x).float().pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(5):  # warm-up (cuBLAS heuristics, NCCL communicators)
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - started) / args.steps

    t0 = time.perf_counter()
    run.checkpoints.save(step=1, reason="on-demand", position={}, blocking=True).result()
    sync_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    future = run.checkpoints.save(step=2, reason="periodic", position={}, blocking=False)
    stall_s = time.perf_counter() - t0
    future.result()
    async_total_s = time.perf_counter() - t0
    run.checkpoints.last_committed_step = None
    t0 = time.perf_counter()
    restored = run.checkpoints.restore()
    torch.cuda.synchronize()
    restore_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    results: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(env.local_rank),
        "world_size": env.world_size,
        "params_millions": params / 1e6,
        "step_ms": step_s * 1e3,
        "steps_per_second": 1 / step_s,
        "samples_per_second": args.batch * env.world_size / step_s,
        "tflops_per_gpu_approx": 6 * params * args.batch / step_s / 1e12,
        "checkpoint_sync_save_s": sync_s,
        "checkpoint_async_stall_s": stall_s,
        "checkpoint_async_total_s": async_total_s,
        "checkpoint_restore_s": restore_s,
        "restored_step": restored.step if restored else None,
        "torch": torch.__version__,
    }
    return results


if __name__ == "__main__":
    sys.exit(main())
