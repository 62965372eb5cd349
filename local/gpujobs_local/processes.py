"""The processes of one local instance: its bootstrap and everything descending from it, found and signalled.

An instance's bootstrap runs in its own session; the workload and torchrun's workers each start
another, so the process tree and the process groups do not tell what belongs to an instance. Its
environment does: ``TMPDIR`` is the instance's own directory, and the bootstrap passes it through to
the workload, which passes it to its workers. `InstanceProcesses` finds the instance's processes by
it, remembers every pid and process group it ever saw (for the checks that nothing is left), and
signals, kills and reaps them. Nothing here blocks past the timeout a caller gives.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

PR_SET_CHILD_SUBREAPER = 36


RENDEZVOUS_PORTS = range(20000, 32768)
"""Where a gang's rendezvous port is picked: below Linux's ephemeral range (32768-60999), so no
outgoing connection of the local cloud (boto3 to the AWS stand-in, the IMDS and report clients) can
take the port as its source between the pick and torchrun's bind, which made a trainer exit 1."""


def free_port(rng: random.Random | None = None) -> int:
    """A TCP port outside the ephemeral range that nobody is bound to right now."""
    pick = rng or random.SystemRandom()
    for _ in range(200):
        port = pick.choice(RENDEZVOUS_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {RENDEZVOUS_PORTS.start}-{RENDEZVOUS_PORTS.stop - 1} after 200 tries")


def become_subreaper() -> bool:
    """Orphans of our descendants become our children (Linux), so we can reap them.

    A killed instance's processes are orphaned at once (their parents die with them). Without this, init
    must reap them, and until it does they are zombies that ``os.killpg(pgid, 0)`` still finds; in a
    container init may never reap them. Process-wide: ``reap`` only waits for pids of our instances.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _proc_state(pid: int) -> tuple[str, int]:
    """(state letter R, S, Z, ..., parent pid), or ("", 0) when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", 0
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def processes_with_env(name: str, value: str, proc_root: Path = Path("/proc")) -> dict[int, int]:
    """pid -> pgid of every live process of ours whose environment has ``name=value``."""
    wanted = f"{name}={value}".encode()
    found: dict[int, int] = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone, or not ours
        if stat[stat.rfind(")") + 2 :].startswith("Z"):
            continue  # a zombie is already dead; its parent reaps it
        if wanted in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError):
                found[pid] = os.getpgid(pid)
    return found


class InstanceProcesses:
    """The bootstrap of one instance and its descendants (see the module docstring)."""

    def __init__(self, *, tmpdir: Path) -> None:
        self.tmpdir = tmpdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_file: IO[bytes] | None = None
        self.pgids: set[int] = set()  # every process group seen running for this instance
        self.pids: set[int] = set()  # every process seen (orphans become ours to reap)

    @property
    def alive(self) -> bool:
        """The bootstrap runs."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def exited(self) -> bool:
        """The bootstrap ran and has ended (by itself or killed)."""
        return self.proc is not None and self.proc.poll() is not None

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path) -> int:
        """Start the bootstrap in its own session, its output appended to `log_path`; returns its pid."""
        self.log_file = log_path.open("ab")
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )
        self.pgids.add(self.proc.pid)
        return self.proc.pid

    def running(self) -> dict[int, int]:
        """pid -> pgid of every process of the instance alive now."""
        found = processes_with_env("TMPDIR", str(self.tmpdir))
        if self.alive and self.proc is not None:
            found[self.proc.pid] = self.proc.pid  # the bootstrap leads its own group
        return found

    def track(self) -> None:
        """Remember what runs now, so it is killed and reaped even once orphaned."""
        self._remember(self.running())

    def signal_bootstrap(self, signum: int) -> None:
        """Signal the bootstrap's group: the bootstrap forwards SIGTERM to the workload, as on EC2."""
        if self.proc is not None and self.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signum)

    def signal_workload(self, signum: int) -> bool:
        """Signal the bootstrap's children (the container's PID 1); False if none runs."""
        if self.proc is None or not self.alive:
            return False
        children = [pid for pid in self.running() if _proc_state(pid)[1] == self.proc.pid]
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        return bool(children)

    def kill(self, signum: int) -> None:
        """Signal every process of the instance and every group they lead or belong to."""
        processes = self.running()
        self._remember(processes)
        for pgid in set(processes.values()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signum)
        for pid in processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def wait_bootstrap(self, timeout: float) -> None:
        """Reap the bootstrap (our own child) if it ends within `timeout`."""
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)

    def reap(self, timeout: float = 0.0) -> None:
        """Collect the exit status of orphans handed to us (see ``become_subreaper``); never blocks past ``timeout``."""
        deadline = time.monotonic() + timeout
        bootstrap = self.proc.pid if self.proc is not None else -1
        while True:
            waiting = False
            for pid in sorted(self.pids - {bootstrap}):  # Popen reaps the bootstrap, its own child
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not ours (yet): gone, alive, or a zombie whose parent is dying
                    state, parent = _proc_state(pid)
                    if not state or (state == "Z" and parent not in self.pids):
                        self.pids.discard(pid)  # gone, or someone else's to reap
                    else:
                        waiting = True  # its parent is one of ours: it is handed to us when that dies
                    continue
                if done:
                    self.pids.discard(pid)
                else:
                    waiting = True
            if not waiting or time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def close_log(self) -> None:
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None

    def _remember(self, processes: dict[int, int]) -> None:
        self.pids.update(processes)
        self.pgids.update(processes.values())
