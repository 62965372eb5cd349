"""A hung gang's stacks, dumped before the control plane kills it (``gpujobs debug JOB`` prints them).

The reconciler that finds a gang hung (its heartbeats stopped) first sends SIGUSR2 to every node's
container through SSM, and terminates the gang a few minutes later (the layer's `domain.hangs`).
The container's launcher takes SIGUSR2 here: for each of torchrun's workers (one per rank) it runs
``py-spy dump --pid P`` (argv, bounded by ``PY_SPY_TIMEOUT``), which reads the stacks of every
thread from outside, so a rank stuck in a collective, in C or holding the GIL is dumped all the
same. Where py-spy is missing or refused (the kernel's Yama ``ptrace_scope`` 1 allows ptrace of
descendants only, and the workers are torchrun's children, not py-spy's), the trainer library's
own dump is used: ``gpujobs_trainer.init`` registers ``faulthandler`` for SIGUSR2, writing every
thread's Python stack to ``$GPUJOBS_STACKS_DIR/rank-R.txt`` from a C signal handler (no GIL
needed), and the launcher signals each worker that catches SIGUSR2 and reads the file back. A
script without the library gets py-spy only.

NCCL's flight recorder is switched on by the launcher (``nccl_flight_recorder_env``: a ring of the
last collectives per rank, dumped by the NCCL watchdog when a collective times out); the traces it
wrote by the time of the dump are copied beside the stacks.

The dumps are written to ``$GPUJOBS_OUTPUT_DIR/gpujobs-hang-dumps/attempt-N/`` (``rank-RRRRR.txt``
per rank, ``nccl-trace-rank-R`` per trace) and the bootstrap is asked to upload them, so they land
in S3 beside the job's outputs: ``outputs/<team>/<job>/[node-K/]gpujobs-hang-dumps/attempt-N/``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpujobs_trainer.outputs import upload_and_wait, write_then_rename
from gpujobs_trainer.workers import Worker, catches

log = logging.getLogger("gpujobs_trainer.stack_dumps")

DUMPS_FOLDER = "gpujobs-hang-dumps"
"""The folder of the output dir the dumps go to (the CLI's copy: `gpujobs_cli.debug`)."""
STACKS_DIR_ENV = "GPUJOBS_STACKS_DIR"
"""Where each rank's faulthandler writes (outside the output folder: an empty file is no artifact)."""
PY_SPY_TIMEOUT = 30.0
"""Longest py-spy run for one rank: a dump takes well under a second; a stuck ptrace does not stall the rest."""
FAULTHANDLER_WAIT = 5.0
"""How long the launcher waits for a rank's faulthandler dump to appear after the signal."""
NCCL_TRACE_PREFIX = "nccl_trace_rank_"
"""`TORCH_NCCL_DEBUG_INFO_TEMP_FILE`'s file name prefix; torch appends the rank."""
NCCL_TRACE_BUFFER_SIZE = "2000"
"""Collectives each rank's flight recorder keeps (torch's own examples use 2000)."""

_registered: list[IO[str]] = []
"""The files faulthandler writes to: kept open for the life of the process."""


def nccl_flight_recorder_env(env: Mapping[str, str], stacks_dir: Path) -> dict[str, str]:
    """Pure: the workers' environment additions for NCCL's flight recorder and the stack dumps. A
    value the job set itself is kept."""
    wanted = {
        STACKS_DIR_ENV: str(stacks_dir),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": NCCL_TRACE_BUFFER_SIZE,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(stacks_dir / NCCL_TRACE_PREFIX),
    }
    return {name: value for name, value in wanted.items() if not env.get(name)}


def install_faulthandler(env: Mapping[str, str], *, rank: int) -> bool:
    """In a worker (``gpujobs_trainer.init``): dump every thread's stack to ``rank-R.txt`` on SIGUSR2.
    Only under the launcher (``GPUJOBS_STACKS_DIR`` set); True when installed."""
    folder = env.get(STACKS_DIR_ENV, "")
    if not folder:
        return False
    file = (Path(folder) / rank_file(rank)).open("a", encoding="utf-8")  # open for the process's life
    _registered.append(file)
    faulthandler.register(signal.SIGUSR2, file=file, all_threads=True, chain=False)
    return True


def rank_file(rank: int | None) -> str:
    return f"rank-{rank:05d}.txt" if rank is not None else "rank-unknown.txt"


def py_spy_argv(py_spy: str, pid: int) -> list[str]:
    """Pure: the py-spy command for one process; argv, never a shell."""
    return [py_spy, "dump", "--pid", str(pid)]


UPLOAD_TIMEOUT = 60.0
"""Longest wait for the bootstrap's upload of the dumps (the gang is terminated a few minutes after the ask)."""


def dump_and_upload(
    workers: Sequence[Worker], *, output_dir: Path, attempt: int, node_rank: int, stacks_dir: Path, upload: bool
) -> list[Path]:
    """The launcher's SIGUSR2 (in a thread of its own): dump every worker, then, under the bootstrap
    (``upload``), ask for the output folder's upload and wait for it. Never raises: a failed dump
    must not end a launcher whose gang may still recover."""
    try:
        dumper = StackDumper(
            folder=output_dir / DUMPS_FOLDER / f"attempt-{attempt}",
            stacks_dir=stacks_dir,
            node_rank=node_rank,
            py_spy=shutil.which("py-spy"),
        )
        written = dumper.dump_all(workers)
        log.info("hang dump: %d file(s) in %s", len(written), dumper.folder)
        if upload:
            uploaded = upload_and_wait(output_dir, timeout=UPLOAD_TIMEOUT)
            log.info("hang dump %s", "uploaded" if uploaded else "not uploaded in time; the bootstrap still tries")
        return written
    except Exception:
        log.exception("hang dump failed")
        return []


@dataclass(frozen=True)
class Dump:
    worker: Worker
    how: str
    """``py-spy``, ``faulthandler`` or ``none``."""
    text: str


@dataclass
class StackDumper:
    """Dumps workers' stacks into ``folder``; ``stacks_dir`` is where their faulthandlers write."""

    folder: Path
    stacks_dir: Path
    node_rank: int
    py_spy: str | None = None
    catches: Callable[[int, int], bool] = field(default=catches)
    py_spy_timeout: float = PY_SPY_TIMEOUT
    faulthandler_wait: float = FAULTHANDLER_WAIT

    def dump_all(self, workers: Sequence[Worker]) -> list[Path]:
        """One file per worker (and each NCCL trace found), written whole; the paths written."""
        written = [self._write(self.dump_one(worker)) for worker in workers]
        written += self._copy_nccl_traces()
        return written

    def dump_one(self, worker: Worker) -> Dump:
        why = "py-spy is not installed in the image"
        if self.py_spy:
            try:
                done = subprocess.run(
                    py_spy_argv(self.py_spy, worker.pid),
                    capture_output=True,
                    text=True,
                    timeout=self.py_spy_timeout,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                why = f"py-spy failed: {exc}"
            else:
                if done.returncode == 0 and done.stdout.strip():
                    return Dump(worker, "py-spy", done.stdout)
                lines = (done.stderr or done.stdout).strip().splitlines()
                why = f"py-spy exited {done.returncode}: {lines[-1] if lines else 'no output'}"
        return self._faulthandler_dump(worker, why)

    def _faulthandler_dump(self, worker: Worker, why: str) -> Dump:
        if not self.catches(worker.pid, signal.SIGUSR2):
            return Dump(worker, "none", f"no stacks: {why}, and the process installs no faulthandler dump")
        path = self.stacks_dir / rank_file(worker.rank)
        before = path.stat().st_size if path.exists() else 0
        try:
            os.kill(worker.pid, signal.SIGUSR2)
        except ProcessLookupError:
            return Dump(worker, "none", f"no stacks: {why}, and the process is gone")
        deadline = time.monotonic() + self.faulthandler_wait
        while (size := path.stat().st_size if path.exists() else 0) <= before and time.monotonic() < deadline:
            time.sleep(0.05)
        if size <= before:
            return Dump(worker, "none", f"no stacks: {why}, and its faulthandler wrote nothing")
        # The handler has started, so a second SIGUSR2 cannot merge with the first: it is held while
        # the first dump is written and starts the second only after it. The second dump's first
        # header is the fence that says the first is whole (reading at the first growth cut it short).
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGUSR2)
        while (end := first_dump_end(text := _read_from(path, before))) is None:
            if time.monotonic() >= deadline:
                return Dump(worker, "faulthandler", f"({why}; the dump may be cut short)\n" + text)
            time.sleep(0.05)
        return Dump(worker, "faulthandler", f"({why})\n" + text[:end])

    def _write(self, dump: Dump) -> Path:
        worker = dump.worker
        path = self.folder / rank_file(worker.rank)
        header = f"# rank {worker.rank} (node {self.node_rank}, pid {worker.pid}): {dump.how}\n"
        temporary = write_then_rename(path)
        temporary.write_text(header + dump.text, encoding="utf-8")
        temporary.replace(path)
        return path

    def _copy_nccl_traces(self) -> list[Path]:
        copied = []
        for trace in sorted(self.stacks_dir.glob(NCCL_TRACE_PREFIX + "*")):
            path = self.folder / trace.name.replace("_", "-")
            temporary = write_then_rename(path)
            shutil.copyfile(trace, temporary)
            temporary.replace(path)
            copied.append(path)
        return copied


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as file:
        file.seek(offset)
        return file.read().decode("utf-8", errors="replace")


def first_dump_end(text: str) -> int | None:
    """Where the first of two back-to-back faulthandler dumps ends in ``text``, or None until the second starts.

    Every thread's block starts with a ``Thread 0x..`` or ``Current thread 0x..`` line; inside one
    dump each block after the first follows a blank line, while a dump that follows another starts
    right after the other's last frame line. That unblanked header is the fence.
    """
    offset = 0
    lines = text.split("\n")
    for previous, line in itertools.pairwise(lines):
        offset += len(previous) + 1
        if previous and line.startswith(("Thread 0x", "Current thread 0x")):
            return offset
    return None
