"""torchrun's workers as the launcher sees them from outside: read from /proc, never from the workers.

The launcher signals its workers (SIGUSR1: checkpoint now; SIGUSR2: dump stacks) only where a
worker catches the signal, since an uncaught one would run its default action and kill the rank.
Standard library only: the launcher imports this before any worker starts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Worker:
    pid: int
    rank: int | None
    """Its global rank (RANK in its environment); None when /proc does not say."""


def rank_of(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """The RANK torchrun gave ``pid``, read from its environment; None if unreadable."""
    try:
        raw = (proc_root / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    for entry in raw.split(b"\0"):
        if entry.startswith(b"RANK="):
            with contextlib.suppress(ValueError):
                return int(entry[5:])
    return None


def signals_caught(pid: int, proc_root: Path = Path("/proc")) -> int:
    """The bitmask of signals ``pid`` has a handler for (SigCgt in /proc/<pid>/status; 0 if gone)."""
    try:
        status = (proc_root / str(pid) / "status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16)
    return 0


def catches(pid: int, signum: int, proc_root: Path = Path("/proc")) -> bool:
    """Whether ``pid`` handles ``signum`` (sending it would not run the default action)."""
    return bool(signals_caught(pid, proc_root) >> (signum - 1) & 1)


def child_pids(parent: int, proc_root: Path = Path("/proc")) -> list[int]:
    """Direct children of ``parent`` (torchrun's workers), read from /proc."""
    children = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Format: "pid (comm) state ppid ..."; comm may contain spaces, so split after ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            children.append(int(entry.name))
    return children
