"""torchrun's stderr, passed on without the traceback of a stop the launcher asked for.

When the launcher stops a job (the spot notice, `docker stop`, a policy stop), it sends torchrun
SIGTERM; torchrun's agent turns the signal into a ``SignalException`` and prints its traceback on
the way out, although nothing went wrong: the workers saved and exited 75. In the job's log that
traceback reads as a crash, and it was the log's last lines. So the launcher reads torchrun's
stderr (the workers', too: they inherit it) and copies it through line by line, except that a
traceback of torchrun's own (a ``Traceback (most recent call last):`` line without a rank prefix,
its indented lines and its final exception line) is held until it ends. It is dropped if that
exception is a ``SignalException`` and the launcher had asked for the stop; any other traceback,
or one after a stop nobody asked for, is passed on whole. Lines of other processes that arrive
while a traceback is held are passed on, in order, when it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import IO

_TRACEBACK = b"Traceback (most recent call last):"
_ASKED_FOR = b"SignalException"


class TorchrunStderr:
    """Copies ``source`` to ``sink`` on a thread of its own; see the module docstring."""

    def __init__(self, source: IO[bytes], sink: IO[bytes], *, stop_asked: Callable[[], bool]) -> None:
        self._source = source
        self._sink = sink
        self._stop_asked = stop_asked
        self._lock = threading.Lock()
        self._held: list[bytes] = []  # the traceback being held (its lines first, then others')
        self._others: list[bytes] = []
        self._thread = threading.Thread(target=self._copy, name="gpujobs-torchrun-stderr", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, *, timeout: float = 5.0) -> None:
        """Wait for the end of torchrun's stderr (bounded: an orphan may keep the pipe open), then
        pass on whatever is still held."""
        if self._thread.is_alive():
            self._thread.join(timeout)
        with self._lock:
            self._release(keep_traceback=True)
            self._sink.flush()

    def feed(self, line: bytes) -> None:
        """One line of torchrun's stderr (public for the tests; the thread calls it)."""
        with self._lock:
            if self._held:
                if line.startswith((b" ", b"\t")):
                    self._held.append(line)
                elif line.strip() and not _is_exception_line(line):
                    self._others.append(line)  # another process's line, in the middle of the traceback
                else:
                    self._held.append(line)
                    if line.strip():  # the exception line ends the traceback
                        self._release(keep_traceback=not (_ASKED_FOR in line and self._stop_asked()))
                return
            if line.rstrip(b"\r\n") == _TRACEBACK:
                self._held.append(line)
                return
            self._sink.write(line)
            self._sink.flush()

    def _copy(self) -> None:
        for line in iter(self._source.readline, b""):
            self.feed(line)

    def _release(self, *, keep_traceback: bool) -> None:
        for line in (self._held if keep_traceback else []) + self._others:
            self._sink.write(line)
        self._held, self._others = [], []
        self._sink.flush()


def _is_exception_line(line: bytes) -> bool:
    """``module.Name: message`` or ``Name``: the last line of a traceback."""
    head = line.split(b":", 1)[0].strip()
    return bool(head) and b" " not in head and (head.endswith((b"Error", b"Exception", b"Interrupt", b"Exit")))
