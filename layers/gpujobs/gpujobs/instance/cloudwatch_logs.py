"""Lines to CloudWatch Logs, so that what an instance printed outlives the instance.

Docker ships a container's output itself (the `awslogs` driver, `DockerRuntime`); `LogShipper` ships
the rest: the bootstrap's own log on every runtime, and the workload's output on the process runtime
(the local cloud), so `gpujobs logs` reads the same streams there as on EC2.

A line is stamped when it is written, never earlier than the line before it, so a stream is always
in order (PutLogEvents refuses a batch that is not). A daemon thread sends what has queued every
`interval` seconds in batches `batches()` cuts within PutLogEvents' limits: 1,048,576 bytes counting
26 bytes per event, 10,000 events, 24 hours from first to last; a longer line is cut to the 256 KB
an event may hold. Shipping is best effort: a batch that still fails after retries is dropped and
said so on stderr, and `close()` waits a bounded time, so logging never holds up training, the exit
report or the shutdown.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

MAX_BATCH_BYTES = 1_048_576
EVENT_OVERHEAD_BYTES = 26
MAX_BATCH_EVENTS = 10_000
MAX_BATCH_SPAN_MS = 24 * 3600 * 1000
MAX_EVENT_BYTES = 256 * 1024 - EVENT_OVERHEAD_BYTES

Event = tuple[int, str]
"""(milliseconds since the epoch, message)."""


def fit_message(message: str) -> str:
    """`message` without its line end, cut to what one event may hold (UTF-8 bytes)."""
    message = message.rstrip("\r\n")
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_EVENT_BYTES:
        return message
    return data[:MAX_EVENT_BYTES].decode("utf-8", "ignore")


def batches(events: Iterable[Event]) -> Iterator[list[dict[str, Any]]]:
    """`events` (in order) as PutLogEvents batches, each within the call's limits."""
    batch: list[dict[str, Any]] = []
    size = 0
    for timestamp, message in events:
        cost = len(message.encode("utf-8", "replace")) + EVENT_OVERHEAD_BYTES
        if batch and (
            len(batch) == MAX_BATCH_EVENTS
            or size + cost > MAX_BATCH_BYTES
            or timestamp - batch[0]["timestamp"] >= MAX_BATCH_SPAN_MS
        ):
            yield batch
            batch, size = [], 0
        batch.append({"timestamp": timestamp, "message": message})
        size += cost
    if batch:
        yield batch


class LogShipper:
    """One log stream, written line by line from any thread; see the module docstring.

    Lines written before `open()` are kept and sent once the stream is known (the bootstrap learns
    its node rank only after the rendezvous).
    """

    def __init__(self, logs: Callable[[], Any], *, interval: float = 1.0, tries: int = 4, backoff: float = 0.5) -> None:
        self._logs = logs
        self._client: Any = None
        self.interval = interval
        self.tries = tries
        self.backoff = backoff
        self.group = self.stream = ""
        self._queue: list[Event] = []
        self._last = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None

    def write(self, message: str) -> None:
        """Queue one line, stamped now (never before the previous one); an empty line is skipped."""
        message = fit_message(message)
        if not message:
            return
        with self._lock:
            self._last = max(self._last, int(time.time() * 1000))
            self._queue.append((self._last, message))

    def open(self, group: str, stream: str) -> None:
        """Start sending to `group`/`stream` (created here if missing) from a daemon thread."""
        self.group, self.stream = group, stream
        self._thread = threading.Thread(target=self._run, name="gpujobs-log-shipper", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued, waiting at most `timeout` seconds; later lines are not sent."""
        if self._thread is None:
            return
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        created = self._call("create_log_stream", logGroupName=self.group, logStreamName=self.stream)
        while created:
            self._wake.wait(self.interval)
            self._wake.clear()
            closing = self._closing  # read first: every line written before close() is queued by now
            with self._lock:
                pending, self._queue = self._queue, []
            for batch in batches(pending):
                self._call("put_log_events", logGroupName=self.group, logStreamName=self.stream, logEvents=batch)
            if closing:
                return

    def _call(self, operation: str, **kwargs: Any) -> bool:
        problem = ""
        for attempt in range(self.tries):
            try:
                if self._client is None:
                    self._client = self._logs()
                getattr(self._client, operation)(**kwargs)
                return True
            except Exception as exc:  # shipping logs must never stop the instance's work
                if type(exc).__name__ == "ResourceAlreadyExistsException":
                    return True
                problem = f"{type(exc).__name__}: {exc}"
            if attempt < self.tries - 1:
                time.sleep(self.backoff * 2**attempt)
        count = len(kwargs.get("logEvents", ()))
        lost = f" ({count} lines dropped)" if count else ""
        print(f"gpujobs-bootstrap: {operation} to {self.group} {self.stream} failed{lost}: {problem}", file=sys.stderr)
        return False


def pump(source: Iterable[bytes], *, echo: BinaryIO, shipper: LogShipper) -> None:
    """Copy a workload's output line by line to `echo` (a binary file) and to `shipper`, until EOF."""
    for line in source:
        try:
            echo.write(line)
            echo.flush()
        except (OSError, ValueError):  # the instance's own log is gone; CloudWatch still gets the line
            pass
        shipper.write(line.decode("utf-8", "replace"))
