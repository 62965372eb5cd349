"""Lines to CloudWatch Logs, so that what an instance printed outlives the instance.

Docker ships a container's output itself (the `awslogs` driver, `DockerRuntime`); `LogShipper` ships
the rest: the bootstrap's own log on every runtime, and the workload's output on the process runtime
(the local cloud), so `gpujobs logs` reads the same streams there as on EC2.

A line is stamped when it is written, never earlier than the line before it, so a stream is always
in order (PutLogEvents refuses a batch that is not). A daemon thread sends what has queued every
`interval` seconds in batches `batches()` cuts within PutLogEvents' limits: 1,048,576 bytes counting
26 bytes per event, 10,000 events, 24 hours from first to last; a longer line is cut to the 256 KB
an event may hold.

A throttled or failing call is retried with exponential backoff (capped at `MAX_BACKOFF_SECONDS`)
for as long as the shipper runs: CreateLogStream is throttled per account and region, and a node
whose stream cannot be created at once must still ship its log once it can. Lines wait in a bounded
queue meanwhile (`MAX_QUEUED_LINES`, `MAX_QUEUED_BYTES`); when it is full the oldest lines go, and
the stream says how many with one line of its own where they were. Shipping is best effort: `close()`
makes a last bounded try, says on stderr what it could not send, and waits a bounded time, so
logging never holds up training, the exit report or the shutdown.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

MAX_BATCH_BYTES = 1_048_576
EVENT_OVERHEAD_BYTES = 26
MAX_BATCH_EVENTS = 10_000
MAX_BATCH_SPAN_MS = 24 * 3600 * 1000
MAX_EVENT_BYTES = 256 * 1024 - EVENT_OVERHEAD_BYTES
MAX_QUEUED_LINES = 100_000
MAX_QUEUED_BYTES = 64 * 1024 * 1024
"""Bounds of what waits to be sent: the oldest lines go first when a stream cannot keep up."""
MAX_BACKOFF_SECONDS = 30.0
CLOSING_TRIES = 3
"""Tries of each call once `close()` was called: the shutdown waits for no stream."""

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
    its node rank only after the rendezvous). A throttled call (or one that could not reach the
    service) is retried until it succeeds or `close()` is called; any other failure is tried `tries`
    times. `sleep` waits between tries (`close()` interrupts the default one) and `clock` stamps
    lines (milliseconds since the epoch): tests inject both.
    """

    def __init__(
        self,
        logs: Callable[[], Any],
        *,
        interval: float = 1.0,
        tries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = MAX_BACKOFF_SECONDS,
        max_lines: int = MAX_QUEUED_LINES,
        max_bytes: int = MAX_QUEUED_BYTES,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._logs = logs
        self._client: Any = None
        self.interval = interval
        self.tries = tries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._closed = threading.Event()
        self._sleep: Callable[[float], object] = self._pause if sleep is None else sleep
        self._clock: Callable[[], int] = _now_ms if clock is None else clock
        self.group = self.stream = ""
        self._queue: deque[Event] = deque()
        self._queued_bytes = 0
        self.dropped = 0
        """Lines dropped so far: the queue was full, a batch was refused, or close() came first."""
        self._untold = 0  # dropped lines the stream has not been told of yet
        self._last = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None

    def write(self, message: str) -> None:
        """Queue one line, stamped now (never before the previous one); an empty line is skipped.
        A full queue drops its oldest line to make room, and counts it."""
        message = fit_message(message)
        if not message:
            return
        with self._lock:
            self._last = max(self._last, self._clock())
            self._queue.append((self._last, message))
            self._queued_bytes += _cost(message)
            while len(self._queue) > self.max_lines or self._queued_bytes > self.max_bytes:
                _, gone = self._queue.popleft()
                self._queued_bytes -= _cost(gone)
                self._count_dropped(1)

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
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        problem = self._call("create_log_stream", logGroupName=self.group, logStreamName=self.stream)
        if problem:
            self._give_up("create_log_stream", 0, problem)
            return
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            closing = self._closing  # read first: every line written before close() is queued by now
            pending, notes = self._take()
            sent = 0
            for batch in batches(pending):
                problem = self._call(
                    "put_log_events", logGroupName=self.group, logStreamName=self.stream, logEvents=batch
                )
                if problem and self._closing:
                    self._give_up("put_log_events", len(pending) - max(sent, notes), problem)
                    return
                if problem:  # refused for what it holds: the batch goes, the next round says so
                    self._count_dropped(len(batch) - (notes if sent == 0 else 0))
                    _say(f"put_log_events to {self.group} {self.stream} failed ({len(batch)} lines dropped): {problem}")
                sent += len(batch)
            if closing:
                return

    def _pause(self, seconds: float) -> None:
        """Back off for `seconds`; once close() is called, for at most a second per try."""
        if self._closed.wait(seconds):
            time.sleep(min(seconds, 1.0))

    def _count_dropped(self, count: int) -> None:
        """Caller holds the lock or is the shipping thread (a plain counter under the GIL)."""
        self.dropped += count
        self._untold += count

    def _take(self) -> tuple[list[Event], int]:
        """Everything queued, led by a line that says how many lines were dropped since the last
        such line (if any were); and how many such lines lead (0 or 1)."""
        with self._lock:
            pending = list(self._queue)
            self._queue.clear()
            self._queued_bytes = 0
            untold, self._untold = self._untold, 0
            stamp = pending[0][0] if pending else self._last
        if not untold:
            return pending, 0
        note = f"gpujobs-bootstrap: {untold} log line(s) dropped here (queue full, or the stream throttled or failing)"
        return [(stamp, note), *pending], 1

    def _give_up(self, operation: str, unsent: int, problem: str) -> None:
        """At close, or when the stream cannot be created: what is left is dropped, said on stderr."""
        with self._lock:
            self._count_dropped(unsent + len(self._queue))
            self._queue.clear()
            self._queued_bytes = 0
        _say(f"{operation} to {self.group} {self.stream} failed ({self.dropped} lines dropped in all): {problem}")

    def _call(self, operation: str, **kwargs: Any) -> str:
        """Call `operation` until it succeeds (""), backing off; returns why it did not. A throttled
        or unreachable service is tried again until close(), then `CLOSING_TRIES` more times."""
        failures = closing_tries = 0
        while True:
            try:
                if self._client is None:
                    self._client = self._logs()
                getattr(self._client, operation)(**kwargs)
                return ""
            except Exception as exc:  # shipping logs must never stop the instance's work
                if _error_code(exc) == "ResourceAlreadyExistsException":
                    return ""
                problem = f"{type(exc).__name__}: {exc}"
                transient = _is_transient(exc)
            failures += 1
            if self._closing:
                closing_tries += 1
            if (not transient and failures >= self.tries) or closing_tries >= CLOSING_TRIES:
                return problem
            # the exponent capped: after 1,024 failures (hours of throttling at the cap) 2**n as a
            # float overflows, and the OverflowError ended the shipping thread for good
            self._sleep(min(self.max_backoff, self.backoff * 2 ** min(failures - 1, 32)))


TRANSIENT_CODES = frozenset(
    {"ThrottlingException", "Throttling", "ServiceUnavailableException", "InternalFailure", "RequestTimeout"}
)


def _error_code(exc: Exception) -> str:
    """The AWS error code of a botocore ClientError (its modelled subclasses too), else the class name."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return type(exc).__name__


def _is_transient(exc: Exception) -> bool:
    """Throttled, or the service did not answer (no response at all: a connection error, a timeout)."""
    return getattr(exc, "response", None) is None or _error_code(exc) in TRANSIENT_CODES


def _now_ms() -> int:
    return int(time.time() * 1000)


def _cost(message: str) -> int:
    return len(message.encode("utf-8", "replace")) + EVENT_OVERHEAD_BYTES


def _say(line: str) -> None:
    print(f"gpujobs-bootstrap: {line}", file=sys.stderr)


def pump(source: Iterable[bytes], *, echo: BinaryIO, shipper: LogShipper) -> None:
    """Copy a workload's output line by line to `echo` (a binary file) and to `shipper`, until EOF."""
    for line in source:
        try:
            echo.write(line)
            echo.flush()
        except (OSError, ValueError):  # the instance's own log is gone; CloudWatch still gets the line
            pass
        shipper.write(line.decode("utf-8", "replace"))
