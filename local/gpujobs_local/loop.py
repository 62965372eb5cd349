"""The local cloud's one loop thread: every invocation runs on it, one at a time.

Lambda runs handlers concurrently; the local cloud does not, so that a run is deterministic and a
handler never races another one of this process over the shared boto3 default session. Each pass
of the loop runs, in this order: the calls other threads handed it (`call()`, e.g. the reconciler
run on demand), one poll of every event source, the schedule when its period is up, and the ticks
other components added (the instance runner, the SSM agent). When nothing was delivered it sleeps
`poll_interval`. A source, schedule or tick that raises is logged; the loop goes on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)

_JOIN_TIMEOUT = 60.0  # seconds stop() waits for the pass in progress


class LoopThread:
    """Runs the event sources, the schedule and the ticks on one thread (see the module docstring)."""

    def __init__(self, *, name: str, poll_interval: float, schedule_every: float) -> None:
        self.name = name
        self.poll_interval = poll_interval
        self.schedule_every = schedule_every
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._ticks: list[Callable[[], None]] = []
        self._shutdowns: list[Callable[[], None]] = []
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._sources: Sequence[Callable[[], bool]] = ()
        self._schedule: Callable[[], object] = lambda: None
        self._next_schedule = 0.0

    def add_tick(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop thread on every pass (every `poll_interval` when idle)."""
        with self._lock:
            self._ticks.append(fn)

    def add_shutdown(self, fn: Callable[[], None]) -> None:
        """Run `fn` in stop(), once the loop has stopped (last added, first run)."""
        self._shutdowns.append(fn)

    def start(self, *, sources: Sequence[Callable[[], bool]], schedule: Callable[[], object]) -> None:
        """Poll `sources` on every pass and run `schedule` every `schedule_every` seconds, from now on."""
        self._sources = sources
        self._schedule = schedule
        self._next_schedule = time.monotonic() + self.schedule_every
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the pass in progress, run the shutdown hooks, cancel the calls left waiting."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=_JOIN_TIMEOUT)
            if self._thread.is_alive():
                log.warning("the local cloud's loop thread did not stop within %g s", _JOIN_TIMEOUT)
            self._thread = None
        for hook in reversed(self._shutdowns):
            try:
                hook()
            except Exception:
                log.exception("shutdown hook %r failed", hook)
        while self._calls:
            _, future = self._calls.popleft()
            future.cancel()
        self._sources = ()

    def call(self, fn: Callable[[], Any]) -> Any:
        """`fn()` run on the loop thread (at once when called from it, or when the loop is stopped)."""
        if threading.current_thread() is self._thread or self._thread is None:
            return fn()
        future: Future[Any] = Future()
        self._calls.append((fn, future))
        return future.result()

    def _run(self) -> None:
        while not self._stopping.is_set():
            busy = False
            while self._calls:
                fn, future = self._calls.popleft()
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:
                        future.set_exception(exc)
                busy = True
            for source in self._sources:
                if self._stopping.is_set():
                    return
                try:
                    busy = source() or busy
                except Exception:
                    log.exception("polling an event source failed")
            if time.monotonic() >= self._next_schedule:
                self._next_schedule = time.monotonic() + self.schedule_every
                with contextlib.suppress(Exception):  # surfaced to observers and dead-lettered
                    self._schedule()
            with self._lock:
                ticks = list(self._ticks)
            for tick in ticks:
                try:
                    tick()
                except Exception:
                    log.exception("tick %r failed", tick)
            if not busy:
                self._stopping.wait(self.poll_interval)
