"""Checkpoint benchmark for gpujobs_trainer (CPU, one process, gloo world of 1).

Measures, for a model + AdamW state of about --size-gb GB:
  1. synchronous checkpoint write throughput / raw sequential write (same bytes, same disk, fsync),
  2. training stall per asynchronous checkpoint / synchronous save time: the time save() blocks
     plus the time the next optimizer.step() waits for the background staging copy, with one
     real forward/backward of the benchmark model in between (and the same with no work in
     between, the worst case),
  3. time from a spot interruption notice (fake IMDSv2) to the committed checkpoint, on local disk
     and on S3 (moto server on 127.0.0.1); on local disk also with the control plane's
     checkpoint-now (SIGUSR1) and SIGTERM arriving around the notice, with the saves it made,
     coalesced as the trainer does and not (each request saving at once, as before),
  4. what trusting only our own checkpoints costs: the digest of the checkpoint's files (the CPU
     time the save spends on digests, computed in its writer threads as the shards are written;
     measured here alone, from the page cache) and a restore (verify + load). The sync save is
     measured both ways in one run, alternating: "before" (SHA-256 digests, unsigned marker) and
     "after" (BLAKE3 digests, marker signed with a checkpoint key), against the same raw write,
  5. the staging rate: GB/s a synchronous save writes into the checkpoint staging folder
     (--staging-dir, default $GPUJOBS_LOCAL_CHECKPOINT_DIR: on an instance the instance-store NVMe
     or the gp3 root volume the bootstrap mounted there), where S3 checkpoints are written first.

    .venv/bin/python bench/checkpoint_bench.py --json bench/checkpoint_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import gpujobs_trainer  # noqa: E402
from gpujobs_trainer.coalescing import COALESCE_SECONDS  # noqa: E402
from gpujobs_trainer.config import TrainerConfig  # noqa: E402
from gpujobs_trainer.digests import BLAKE3, SHA256, file_digest  # noqa: E402
from gpujobs_trainer.storage import local_sizes  # noqa: E402
from tests.training.harness import FakeImds  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build(size_gb: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    width = WIDTH
    params_wanted = size_gb * 1e9 / 12  # fp32 weights + two Adam moments = 12 bytes/param
    layers = max(1, round(params_wanted / (width * width)))
    model = gpujobs_trainer.prepare_model(nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()  # materialise the Adam moments
    return model, optimizer


WIDTH = 4096


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: int) -> None:
    """One real training step of the benchmark model (forward, backward, AdamW step)."""
    optimizer.zero_grad(set_to_none=False)
    model(torch.randn(batch, WIDTH)).square().mean().backward()
    optimizer.step()


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for state in optimizer.state.values():
        total += sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    return total


def raw_write(folder: Path, nbytes: int) -> float:
    chunk = memoryview(os.urandom(64 * 1024 * 1024))  # slices of a memoryview copy nothing
    path = folder / "raw.bin"
    started = time.perf_counter()
    with open(path, "wb") as handle:
        written = 0
        while written < nbytes:
            piece = chunk[: min(len(chunk), nbytes - written)]
            handle.write(piece)
            written += len(piece)
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def digest_seconds(folder: Path, algorithm: str) -> float:
    started = time.perf_counter()
    for name in local_sizes(folder):
        file_digest(folder / name, algorithm)
    return time.perf_counter() - started


BENCH_KEY = bytes(range(32))
VARIANTS = {"before": (SHA256, b""), "after": (BLAKE3, BENCH_KEY)}
"""Sync save variants measured alternately: (digest algorithm, checkpoint key)."""


def make_run(model: nn.Module, optimizer: torch.optim.Optimizer, env: dict[str, str]) -> gpujobs_trainer.Run:
    return gpujobs_trainer.init(model=model, optimizer=optimizer, config=TrainerConfig.from_env(env))


def sync_saves(
    manager: Any, root: Path, reps: int, checkpoint_bytes: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Sync saves of both `VARIANTS` and raw writes of the same byte count, alternating; the times
    of each, the time to digest each save's files alone, and the checkpoint's size."""
    # Saves (both variants) and raw writes alternate so that all see the same disk (it is shared
    # and noisy); the order rotates each repetition, so none always runs first.
    times: dict[str, list[float]] = {name: [] for name in (*VARIANTS, "raw")}
    digest_times: dict[str, list[float]] = {SHA256: [], BLAKE3: []}
    step = 0
    for i in range(reps):
        order = [*VARIANTS, "raw"]
        for name in order[i % 3 :] + order[: i % 3]:
            manager.wait_idle()  # saves are minutes apart in practice: the last purge is done
            if name == "raw":
                times["raw"].append(raw_write(root, checkpoint_bytes))
                continue
            manager.digest, manager.key = VARIANTS[name]
            step += 1
            started = time.perf_counter()
            result = manager.save(step=step, reason="periodic", position={}, blocking=True).result()
            times[name].append(time.perf_counter() - started)
            assert result.committed
            folder = manager.store.staging_dir(step)
            checkpoint_bytes = sum(local_sizes(folder).values())
            digest_times[VARIANTS[name][0]].append(digest_seconds(folder, VARIANTS[name][0]))
    return times, digest_times, checkpoint_bytes


def sync_and_async(
    model: nn.Module, optimizer: torch.optim.Optimizer, root: Path, reps: int, batch: int
) -> dict[str, Any]:
    run = make_run(model, optimizer, {"GPUJOBS_CHECKPOINT_URI": str(root / "ckpt"), "GPUJOBS_IMDS": "off"})
    manager = run.checkpoints
    # One untimed save and raw write first: this VM's first touch of fresh memory (page cache
    # included) is several times slower than steady state and would penalise whichever ran first.
    assert manager.save(step=10_000, reason="periodic", position={}, blocking=True).result().committed
    manager.wait_idle()
    checkpoint_bytes = sum(local_sizes(manager.store.staging_dir(10_000)).values())
    raw_write(root, checkpoint_bytes)
    manager.store.delete(10_000)
    times, digest_times, checkpoint_bytes = sync_saves(manager, root, reps, checkpoint_bytes)
    sync_times, raw_times = times["after"], times["raw"]
    manager.digest, manager.key = VARIANTS["after"]  # the async saves and the restore below
    step_times = []
    for _ in range(reps):
        started = time.perf_counter()
        train_step(model, optimizer, batch)
        step_times.append(time.perf_counter() - started)
    blocking, stalls, worst, async_totals, busy_steps = [], [], [], [], []
    for i in range(reps):
        # the training step that follows the save: its optimizer.step() waits for staging
        manager.wait_idle()
        started = time.perf_counter()
        future = manager.save(step=1000 + 2 * i, reason="periodic", position={}, blocking=False)
        returned = time.perf_counter()
        manager.last_staging_wait_s = 0.0
        train_step(model, optimizer, batch)
        busy_steps.append(time.perf_counter() - returned)
        blocking.append(returned - started)
        stalls.append(returned - started + manager.last_staging_wait_s)
        assert future.result().committed
        async_totals.append(time.perf_counter() - started)
        # worst case: optimizer.step() right after save() returns, nothing to overlap with
        manager.wait_idle()
        started = time.perf_counter()
        future = manager.save(step=1001 + 2 * i, reason="periodic", position={}, blocking=False)
        returned = time.perf_counter()
        manager.last_staging_wait_s = 0.0
        optimizer.step()
        worst.append(returned - started + manager.last_staging_wait_s)
        assert future.result().committed
    manager.wait_idle()
    manager.last_committed_step = None
    started = time.perf_counter()
    assert manager.restore() is not None
    restore_s = time.perf_counter() - started
    manager.close()
    sync_s, raw_s = statistics.median(sync_times), statistics.median(raw_times)
    return {
        "checkpoint_bytes": checkpoint_bytes,
        "sync_save_s": sync_s,
        "sync_throughput_mb_s": checkpoint_bytes / sync_s / 1e6,
        "raw_write_s": raw_s,
        "raw_throughput_mb_s": checkpoint_bytes / raw_s / 1e6,
        "sync_vs_raw_ratio": raw_s / sync_s,
        "sync_vs_raw_ratio_per_pair": sorted(r / t for r, t in zip(raw_times, sync_times, strict=True)),
        "sync_save_before_s": statistics.median(times["before"]),
        "sync_vs_raw_ratio_before": raw_s / statistics.median(times["before"]),
        "sync_vs_raw_ratio_before_per_rep": sorted(r / t for r, t in zip(raw_times, times["before"], strict=True)),
        "sync_save_before_all_s": times["before"],
        "sha256_s": statistics.median(digest_times[SHA256]),
        "blake3_s": statistics.median(digest_times[BLAKE3]),
        "digest_vs_sync_ratio": statistics.median(digest_times[BLAKE3]) / sync_s,
        "restore_s": restore_s,
        "train_step_s": statistics.median(step_times),
        "train_step_during_save_s": statistics.median(busy_steps),
        "async_blocking_s": statistics.median(blocking),
        "async_stall_s": statistics.median(stalls),
        "async_total_s": statistics.median(async_totals),
        "async_stall_vs_sync_ratio": statistics.median(stalls) / sync_s,
        "async_stall_no_overlap_s": statistics.median(worst),
        "async_stall_no_overlap_vs_sync_ratio": statistics.median(worst) / sync_s,
        "sync_save_all_s": sync_times,
        "raw_write_all_s": raw_times,
        "async_stall_all_s": stalls,
    }


def notice_to_commit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    env: dict[str, str],
    step_s: float,
    *,
    all_signals: bool = False,
    coalesce_seconds: float = COALESCE_SECONDS,
) -> tuple[float, int]:
    """Seconds from the spot notice to the committed preemption checkpoint, and the saves made.

    ``all_signals``: the warning arrives three ways, as from the control plane on EC2: checkpoint-now
    (SIGUSR1) a step before the notice, SIGTERM a step after it. ``coalesce_seconds=0`` is how the
    trainer behaved before requests coalesced (each one saved at once)."""
    with FakeImds() as imds:
        env = {**env, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint, "GPUJOBS_IMDS_POLL_SECONDS": "0.1"}
        run = make_run(model, optimizer, env)
        run.coordinator.coalesce_seconds = coalesce_seconds
        commits: list[int] = []
        run.checkpoints.on_commit = lambda marker, _uri: commits.append(marker.step)
        step = 0
        noticed_at = 0.0
        while True:
            step += 1
            time.sleep(step_s)  # stands in for a training step
            if all_signals and step == 4:
                os.kill(os.getpid(), signal.SIGUSR1)
            if step == 5:
                imds.announce_termination()
                noticed_at = time.perf_counter()
            if all_signals and step == 6:
                os.kill(os.getpid(), signal.SIGTERM)
            if run.step_done(step):
                break
        elapsed = time.perf_counter() - noticed_at
        assert run.exit_code == gpujobs_trainer.PREEMPTED_EXIT_CODE
        run.checkpoints.close()
        if run.watcher is not None:
            run.watcher.stop()
        return elapsed, len(commits)


def warning_with_all_signals(
    model: nn.Module, optimizer: torch.optim.Optimizer, root: Path, step_s: float, reps: int
) -> dict[str, Any]:
    """The notice alone, then with checkpoint-now and SIGTERM around it, coalesced and not: the
    three cases alternate ``reps`` times (the machine is shared and noisy); medians, and the most
    saves any repetition made."""
    cases = [("notice_only", False, COALESCE_SECONDS), ("all_signals", True, COALESCE_SECONDS)]
    cases.append(("all_signals_uncoalesced", True, 0.0))
    times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    saves: dict[str, int] = dict.fromkeys(times, 0)
    for rep in range(reps):
        for name, all_signals, window in cases:
            env = {"GPUJOBS_CHECKPOINT_URI": str(root / f"{name}-{rep}")}
            seconds, made = notice_to_commit(
                model, optimizer, env, step_s, all_signals=all_signals, coalesce_seconds=window
            )
            times[name].append(seconds)
            saves[name] = max(saves[name], made)
    results: dict[str, Any] = {}
    for name, seconds_each in times.items():
        results[f"warning_{name}_s"] = statistics.median(seconds_each)
        results[f"warning_{name}_all_s"] = seconds_each
        results[f"warning_{name}_saves"] = saves[name]
    results["warning_all_signals_vs_notice_only_ratio"] = (
        results["warning_all_signals_s"] / results["warning_notice_only_s"]
    )
    results["warning_uncoalesced_vs_coalesced_ratio"] = (
        results["warning_all_signals_uncoalesced_s"] / results["warning_all_signals_s"]
    )
    return results


def staging_rate(model: nn.Module, optimizer: torch.optim.Optimizer, staging: Path) -> dict[str, Any]:
    """GB/s of a synchronous save (DCP shards + digests + fsync) into the staging folder, after an untimed one."""
    folder = Path(tempfile.mkdtemp(prefix="gpujobs-bench-staging-", dir=staging))
    run = make_run(model, optimizer, {"GPUJOBS_CHECKPOINT_URI": str(folder), "GPUJOBS_IMDS": "off"})
    manager = run.checkpoints
    assert manager.save(step=1, reason="periodic", position={}, blocking=True).result().committed
    manager.wait_idle()
    started = time.perf_counter()
    assert manager.save(step=2, reason="periodic", position={}, blocking=True).result().committed
    seconds = time.perf_counter() - started
    written = sum(local_sizes(manager.store.staging_dir(2)).values())
    manager.wait_idle()
    shutil.rmtree(folder, ignore_errors=True)
    return {"staging_dir": str(staging), "staging_s": seconds, "staging_gb_s": written / 1e9 / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64, help="batch of the simulated training step")
    parser.add_argument("--dir", default="", help="where to write (default: a temp dir on /tmp)")
    parser.add_argument("--no-s3", action="store_true", help="skip the moto S3 measurement")
    parser.add_argument(
        "--staging-dir",
        default=os.environ.get("GPUJOBS_LOCAL_CHECKPOINT_DIR", ""),
        help="the checkpoint staging folder to measure (default: $GPUJOBS_LOCAL_CHECKPOINT_DIR, else --dir's temp dir)",
    )
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()

    os.environ.update(
        {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    )
    gpujobs_trainer.setup_distributed()
    model, optimizer = build(args.size_gb)
    results: dict[str, Any] = {"state_bytes": state_bytes(model, optimizer), "torch": torch.__version__}
    with tempfile.TemporaryDirectory(dir=args.dir or None) as tmp:
        root = Path(tmp)
        results.update(sync_and_async(model, optimizer, root, args.reps, args.batch))
        results.update(staging_rate(model, optimizer, Path(args.staging_dir) if args.staging_dir else root))
        step_s = 0.05
        results.update(warning_with_all_signals(model, optimizer, root, step_s, args.reps))
        results["notice_to_commit_local_s"] = results["warning_notice_only_s"]
        if not args.no_s3:
            import boto3
            from moto.server import ThreadedMotoServer

            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
            os.environ.update(
                {
                    "AWS_ENDPOINT_URL": f"http://{host}:{port}",
                    "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1",
                }
            )
            boto3.client("s3").create_bucket(Bucket="bench")
            results["notice_to_commit_s3_moto_s"], _ = notice_to_commit(
                model,
                optimizer,
                {"GPUJOBS_CHECKPOINT_URI": "s3://bench/ckpt", "GPUJOBS_LOCAL_CHECKPOINT_DIR": str(root / "stage")},
                step_s,
            )
            server.stop()
    results["step_seconds_simulated"] = step_s
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def print_table(r: dict[str, Any]) -> None:
    rows = [
        ("model + AdamW state", f"{r['state_bytes'] / 1e9:.2f} GB", ""),
        ("checkpoint on disk", f"{r['checkpoint_bytes'] / 1e9:.2f} GB", ""),
        ("raw sequential write (fsync)", f"{r['raw_write_s']:.2f} s  {r['raw_throughput_mb_s']:.0f} MB/s", ""),
        ("sync checkpoint save", f"{r['sync_save_s']:.2f} s  {r['sync_throughput_mb_s']:.0f} MB/s", "BLAKE3, signed"),
        ("sync throughput / raw", f"{r['sync_vs_raw_ratio']:.2f}", "target >= 0.7"),
        (
            "  before: SHA-256, unsigned",
            f"{r['sync_save_before_s']:.2f} s, ratio {r['sync_vs_raw_ratio_before']:.2f}",
            "same run, alternating",
        ),
        (
            "digest of the checkpoint files",
            f"BLAKE3 {r['blake3_s']:.2f} s, SHA-256 {r['sha256_s']:.2f} s",
            "alone; in a save it runs in the writer threads",
        ),
        ("restore: verify digests + load", f"{r['restore_s']:.2f} s", ""),
        ("training step (fwd+bwd+AdamW)", f"{r['train_step_s']:.2f} s", "no save running"),
        ("async save: save() blocks", f"{r['async_blocking_s']:.3f} s (total {r['async_total_s']:.2f} s)", ""),
        ("async save: training stall", f"{r['async_stall_s']:.3f} s", "save() + wait in next optimizer.step()"),
        ("async stall / sync save", f"{r['async_stall_vs_sync_ratio']:.3f}", "target <= 0.1"),
        ("  step while saving", f"{r['train_step_during_save_s']:.2f} s", "incl. the wait, CPU shared"),
        (
            "  stall, step() right after save()",
            f"{r['async_stall_no_overlap_s']:.3f} s",
            "worst case, nothing overlaps",
        ),
        ("  worst-case stall / sync save", f"{r['async_stall_no_overlap_vs_sync_ratio']:.3f}", ""),
        ("notice -> committed, local disk", f"{r['notice_to_commit_local_s']:.2f} s", "IMDS poll 0.1 s"),
        ("staging rate (sync save)", f"{r['staging_gb_s']:.2f} GB/s  ({r['staging_s']:.2f} s)", r["staging_dir"]),
        (
            "  + checkpoint-now and SIGTERM",
            f"{r['warning_all_signals_s']:.2f} s, {r['warning_all_signals_saves']} save(s)",
            f"{r['warning_all_signals_vs_notice_only_ratio']:.2f} of the notice alone",
        ),
        (
            "  the same, uncoalesced (before)",
            f"{r['warning_all_signals_uncoalesced_s']:.2f} s, {r['warning_all_signals_uncoalesced_saves']} save(s)",
            f"{r['warning_uncoalesced_vs_coalesced_ratio']:.2f}x the coalesced time",
        ),
    ]
    if "notice_to_commit_s3_moto_s" in r:
        rows.append(("notice -> committed, S3 (moto)", f"{r['notice_to_commit_s3_moto_s']:.2f} s", "IMDS poll 0.1 s"))
    width = max(len(name) for name, _, _ in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:<32} {note}")


if __name__ == "__main__":
    sys.exit(main())
