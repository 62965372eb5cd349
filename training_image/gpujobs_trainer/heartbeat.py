"""Heartbeats: how the control plane tells a slow training job from a stuck one.

Rank 0 reports a `Training Heartbeat` (step and rate) from the step boundary, at most every
`GPUJOBS_HEARTBEAT_SECONDS`. The reconciler calls a trainer hung once no heartbeat came for the
job's `trainer.heartbeat_overdue_minutes` (or, for an attempt's first heartbeat, which the first
step boundary sends, `trainer.first_heartbeat_minutes` after the attempt started) and replaces
its gang. A healthy job can spend longer
than that between two step boundaries: an evaluation over a large set, a blocking save, a
recompile. Inside ``run.busy()`` a keep-alive thread goes on reporting every period, with the step
unchanged and the block's label as ``busy``, so such a phase is not taken for a hang; the step
boundary takes over again when the block ends.

Every heartbeat carries the newest metrics the script reported (``run.log``, ``step_done(metrics=)``;
`metrics` bounds them) and the rate: the control plane shows them in ``gpujobs status`` and keeps a
bounded series for ``gpujobs metrics``. They are signed with the step (`signing.SIGNED_EXTENSIONS`).

A keep-alive proves only that the process lives, so it is tied to a block that ends: a deadlock
inside ``busy()`` would keep the job alive until its runtime cap. Wrap the long phase, never the
training loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime

from gpujobs_trainer.events import TRAINING_HEARTBEAT, Publisher
from gpujobs_trainer.metrics import LatestMetrics

log = logging.getLogger("gpujobs_trainer")


class Heartbeat:
    """Rank 0's heartbeats: rate-limited from the step boundary, periodic inside busy blocks.

    With ``enabled`` False (other ranks, or reporting off) every call is a cheap no-op, so the
    script can call ``run.busy()`` on every rank alike.
    """

    def __init__(
        self,
        *,
        publisher: Publisher,
        job_id: str,
        attempt: int,
        interval: float,
        samples_per_step: int | None,
        enabled: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._publisher = publisher
        self._job_id = job_id
        self._attempt = attempt
        self._interval = interval
        self._samples_per_step = samples_per_step
        self._enabled = enabled
        self._clock = clock
        self._lock = threading.Lock()
        self._step = 0
        self._since = (clock(), 0)  # (when, step) of the last report: the rate is measured from there
        self._busy: list[str] = []
        self._keeper: tuple[threading.Thread, threading.Event] | None = None
        self._metrics = LatestMetrics()

    def record(self, metrics: Mapping[str, object]) -> None:
        """Keep the newest value of each metric for the next heartbeat (a bad one is dropped, logged)."""
        if not self._enabled or not metrics:
            return  # other ranks keep nothing
        with self._lock:
            self._metrics.update(metrics)

    def restart_at(self, step: int) -> None:
        """Measure the rate from ``step`` now (a resumed run starts there)."""
        with self._lock:
            self._step = step
            self._since = (self._clock(), step)

    def after_step(self, step: int) -> None:
        """Report ``step`` if a period has passed since the last report."""
        if not self._enabled:
            return
        with self._lock:
            self._step = step
            now = self._clock()
            since, step_then = self._since
            elapsed = now - since
            if elapsed < self._interval or elapsed <= 0:
                return
            self._since = (now, step)
        self._publish(step, steps_per_second=(step - step_then) / elapsed, busy=None)

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Keep reporting every period while the block runs (blocks may nest, from any thread)."""
        if not self._enabled:
            yield
            return
        with self._lock:
            self._busy.append(what)
            if self._keeper is None:
                stop = threading.Event()
                thread = threading.Thread(target=self._keep_alive, args=(stop,), name="gpujobs-heartbeat", daemon=True)
                self._keeper = (thread, stop)
                thread.start()
        log.debug("busy (%s): heartbeats continue every %.0f s", what, self._interval)
        try:
            yield
        finally:
            with self._lock:
                self._busy.remove(what)
                keeper = self._keeper if not self._busy else None
                if keeper is not None:
                    self._keeper = None
                    keeper[1].set()
            if keeper is not None:
                keeper[0].join()

    def _keep_alive(self, stop: threading.Event) -> None:
        while not stop.wait(self._interval):
            with self._lock:
                if stop.is_set():  # the last block ended while this one waited for the lock
                    return
                step, what = self._step, self._busy[-1]
                self._since = (self._clock(), step)
            self._publish(step, steps_per_second=0.0, busy=what)

    def _publish(self, step: int, *, steps_per_second: float, busy: str | None) -> None:
        with self._lock:
            metrics = self._metrics.snapshot()
        detail: dict[str, object] = {
            "job_id": self._job_id,
            "attempt": self._attempt,
            "step": step,
            "steps_per_second": round(steps_per_second, 3),
            "samples_per_second": (
                round(steps_per_second * self._samples_per_step, 3) if self._samples_per_step else None
            ),
            "metrics": metrics,
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if busy is not None:
            detail["busy"] = busy
        self._publisher.publish(TRAINING_HEARTBEAT, detail)
