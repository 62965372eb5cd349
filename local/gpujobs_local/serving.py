"""A small HTTP server of the local cloud on an ephemeral port: started once, closed idempotently.

The fake IMDS and the local Lambda endpoint are both one of these, each with its own handler.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import TypeVar

_S = TypeVar("_S", bound="LocalServer")


class LocalServer:
    """Serves `handler` on `host` (an ephemeral port) from a daemon thread named `name`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, host: str, name: str) -> None:
        self._started = self._closed = False
        self.server = ThreadingHTTPServer((host, 0), handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    def start(self: _S) -> _S:
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            self.server.shutdown()
        self.server.server_close()

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
