"""GPU smoke benchmark for a machine with CUDA (runs in well under 5 minutes).

Measures bf16 DDP step throughput and gpujobs_trainer checkpoint save/restore times on every
visible GPU, then prints a results table. Without CUDA it exits with code 2 and says so.

    torchrun --standalone --nproc-per-node $(nvidia-smi -L | wc -l) bench/gpu_check.py
    python bench/gpu_check.py            # one GPU, no torchrun needed
    python bench/gpu_check.py --ddp-compare

`--health` runs the node's GPU check as the bootstrap runs it before a gang trains
(`gpujobs.instance.gpu_health`: nvidia-smi's count, ECC and pending retirements against the
catalog's GPUs for `--instance-type`, `dcgmi diag -r 1` where DCGM is installed, hardware XIDs in
`dmesg`), prints what each tool said, how long it took and the verdict; exit 1 if unhealthy. It
needs no torch.

`--all-reduce` measures the gang's collective bandwidth: run it under torchrun on every GPU of every
node; rank 0 prints the all-reduce's algorithm and bus bandwidth (nccl-tests' busbw: algbw * 2(n-1)/n,
the slowest rank's time) per message size, measured by the launcher's own check
(`gpujobs_trainer.interconnect.measure`). The launcher runs that check before every multi-node gang
trains and exits 123 when the 256 MiB figure is below a quarter of the type's network bandwidth
(docs/training.md). On CPU it runs over gloo (a smoke run, not a figure).

    python bench/gpu_check.py --health --instance-type p4d.24xlarge
    torchrun --standalone --nproc-per-node 8 bench/gpu_check.py --all-reduce

`--ddp-compare` measures what the trainer costs a multi-GPU DDP step: the same model and batch run
under torchrun on every GPU twice, once as a bare DDP loop (init_process_group, DDP, autocast,
AdamW) and once through gpujobs_trainer (setup_distributed, prepare_model, run.autocast and
run.step_done's per-step all_reduce), and the ratio of their step throughputs is printed. It needs
at least 2 GPUs and says "skipped: N GPU(s)" (exit 0) otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
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
    parser.add_argument("--ddp-compare", action="store_true", help="gpujobs trainer vs bare DDP step throughput")
    parser.add_argument("--ddp-worker", choices=("bare", "gpujobs"), default="", help=argparse.SUPPRESS)
    parser.add_argument("--health", action="store_true", help="run the node's GPU check (gpu_health) for real")
    parser.add_argument("--instance-type", default="", help="--health: expect this type's GPUs (packaged catalog)")
    parser.add_argument("--all-reduce", action="store_true", help="all-reduce bandwidth of the gang (under torchrun)")
    parser.add_argument("--sizes-mb", default="8,64,256", help="--all-reduce: message sizes in MiB")
    return parser.parse_args()


def health(args: argparse.Namespace) -> int:
    """The bootstrap's GPU check, for real, with each tool's output and time shown."""
    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "layers" / "gpujobs")]
    from gpujobs.adapters.catalog import gpu_counts
    from gpujobs.instance import gpu_health

    def shown(argv: list[str], timeout: float) -> tuple[int, str] | None:
        started = time.perf_counter()
        out = gpu_health.run_tool(argv, timeout)
        took = time.perf_counter() - started
        said = "not installed" if out is None else f"exit {out[0]} in {took:.1f}s"
        print(f"$ {' '.join(argv)}  ({said})")
        if out is not None:
            print("\n".join("    " + line for line in out[1].splitlines()[-40:]))
        return out

    expected = gpu_counts().get(args.instance_type, 0) if args.instance_type else 0
    if not expected:
        listed = gpu_health.run_tool(["nvidia-smi", "-L"], gpu_health.QUERY_TIMEOUT)
        expected = len(listed[1].splitlines()) if listed and listed[0] == 0 else 1
    result = gpu_health.check_node(expected_gpus=expected, run=shown)
    print(f"expected GPUs: {expected}")
    for note in result.notes:
        print(f"note: {note}")
    print(f"verdict: {'healthy' if result.ok else 'UNHEALTHY: ' + result.summary()}")
    return 0 if result.ok else 1


def all_reduce(args: argparse.Namespace) -> int:
    """One rank of the all-reduce bandwidth check; rank 0 prints algbw and busbw per size."""
    import torch.distributed as dist

    from gpujobs_trainer import interconnect

    if "RANK" not in os.environ:
        print("gpu_check all-reduce: run it under torchrun (a world of one has no bus bandwidth)")
        return 0
    device = interconnect.start_group()
    results = []
    for mb in (int(x) for x in args.sizes_mb.split(",")):
        figure = interconnect.measure(device, nbytes=mb * 2**20, iterations=max(1, args.steps // 5))
        results.append(
            {
                "mib": mb,
                "ms": figure.seconds * 1e3,
                "algbw_gbps": figure.bytes / figure.seconds / 1e9,
                "busbw_gbps": figure.busbw_gbs,
            }
        )
    if dist.get_rank() == 0:
        backend = "nccl" if device.type == "cuda" else "gloo (CPU: a smoke run, not a figure)"
        print(f"all-reduce over {dist.get_world_size()} rank(s), {backend}:")
        for r in results:
            print(
                f"  {r['mib']:>5} MiB  {r['ms']:8.2f} ms  algbw {r['algbw_gbps']:7.2f} GB/s  busbw {r['busbw_gbps']:7.2f} GB/s"
            )
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    dist.destroy_process_group()
    return 0


def ddp_compare(args: argparse.Namespace) -> int:
    """Run both DDP loops under torchrun on every GPU and print their throughputs and ratio."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        print(f"gpu_check ddp-compare: skipped: {gpus} GPU(s)")
        return 0
    shape = ["--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch)]
    step_ms: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for worker in ("bare", "gpujobs"):
            out = Path(tmp) / f"{worker}.json"
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"]
            argv += [__file__, "--ddp-worker", worker, "--steps", str(args.steps), "--json", str(out), *shape]
            subprocess.run(argv, check=True, env={**os.environ, "GPUJOBS_CHECKPOINT_URI": str(Path(tmp) / "ckpt")})
            step_ms[worker] = json.loads(out.read_text())["step_ms"]
    ratio = step_ms["bare"] / step_ms["gpujobs"]
    print(f"DDP on {gpus} GPUs, {args.layers}x{args.width} MLP, batch {args.batch} per GPU:")
    print(f"  bare torchrun      {step_ms['bare']:.2f} ms/step")
    print(f"  gpujobs trainer    {step_ms['gpujobs']:.2f} ms/step")
    print(f"  throughput ratio   {ratio:.3f} (gpujobs / bare)")
    return 0


def ddp_worker(args: argparse.Namespace) -> int:
    """One rank of a timed DDP loop, bare or through gpujobs_trainer; rank 0 writes step_ms to --json."""
    import torch
    import torch.distributed as dist
    from torch import nn

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    net = nn.Sequential(*layers)
    run: Any = None
    if args.ddp_worker == "bare":
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        model: Any = nn.parallel.DistributedDataParallel(net.cuda(), device_ids=[local_rank])
    else:
        import gpujobs_trainer
        from gpujobs_trainer.config import TrainerConfig

        gpujobs_trainer.setup_distributed()
        model = gpujobs_trainer.prepare_model(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if args.ddp_worker == "gpujobs":
        config = TrainerConfig.from_env(
            {"GPUJOBS_CHECKPOINT_URI": os.environ["GPUJOBS_CHECKPOINT_URI"], "GPUJOBS_IMDS": "off"}
        )
        run = gpujobs_trainer.init(model=model, optimizer=optimizer, config=config)
    x = torch.randn(args.batch, args.width, device=f"cuda:{local_rank}")

    def step(n: int) -> None:
        autocast = run.autocast() if run else torch.autocast("cuda", dtype=torch.bfloat16)
        with autocast:
            loss = model(x).float().pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if run:
            run.step_done(n)

    for n in range(1, 6):  # warm-up (cuBLAS heuristics, NCCL communicators)
        step(n)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for n in range(6, 6 + args.steps):
        step(n)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - started) / args.steps * 1e3
    if dist.get_rank() == 0 and args.json:
        Path(args.json).write_text(json.dumps({"step_ms": step_ms}) + "\n")
    if run:
        run.checkpoints.wait_idle()  # no run.finish(): its final checkpoint is not what is measured
    dist.destroy_process_group()
    return 0


def main() -> int:
    args = parse_args()
    if args.health:
        return health(args)
    if args.all_reduce:
        return all_reduce(args)
    if args.ddp_compare:
        return ddp_compare(args)
    if args.ddp_worker:
        return ddp_worker(args)
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
