"""A fake IMDSv2 on 127.0.0.1: what a local instance (and the trainer's watcher) asks its metadata service.

A session token from ``PUT /latest/api/token`` (with a TTL header) is required for every GET. It serves
``/latest/user-data``, any ``/latest/meta-data/<path>`` given in ``metadata``, and the two spot signals:
``spot/instance-action`` and ``events/recommendations/rebalance`` (JSON, 404 until set), as on EC2
(docs: aws-contracts §1.9).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

SPOT_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"


class FakeImds:
    """IMDSv2 on 127.0.0.1 (ephemeral port): token PUT, metadata, user data, spot and rebalance notices."""

    def __init__(
        self, *, metadata: Mapping[str, str] | None = None, user_data: bytes | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.instance_action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None
        self.metadata: dict[str, str] = dict(metadata or {})
        self.user_data = user_data
        self.valid_tokens: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self.unauthorized_gets = 0
        """GETs without a valid IMDSv2 token: a client that never does so is an IMDSv2 client."""
        self._counter = 0
        self._lock = threading.Lock()
        self._started = self._closed = False
        self.server = ThreadingHTTPServer((host, 0), self._handler())
        self.server.daemon_threads = True
        self.endpoint = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="fake-imds", daemon=True)

    def _new_token(self) -> str:
        with self._lock:
            self._counter += 1
            token = f"token-{self._counter}"
            self.valid_tokens.add(token)
        return token

    def _body(self, path: str) -> bytes | None:
        if path == SPOT_ACTION_PATH:
            return None if self.instance_action is None else json.dumps(self.instance_action).encode()
        if path == REBALANCE_PATH:
            return None if self.rebalance is None else json.dumps(self.rebalance).encode()
        if path == "/latest/user-data":
            return self.user_data
        prefix = "/latest/meta-data/"
        if path.startswith(prefix) and path[len(prefix) :] in self.metadata:
            return self.metadata[path[len(prefix) :]].encode()
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: bytes = b"") -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                imds.requests.append(("PUT", self.path))
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._reply(400)
                    return
                self._reply(200, imds._new_token().encode())

            def do_GET(self) -> None:
                imds.requests.append(("GET", self.path))
                if self.headers.get("X-aws-ec2-metadata-token") not in imds.valid_tokens:
                    imds.unauthorized_gets += 1
                    self._reply(401)
                    return
                body = imds._body(self.path)
                if body is None:
                    self._reply(404)
                else:
                    self._reply(200, body)

        return Handler

    def start(self) -> FakeImds:
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

    def __enter__(self) -> FakeImds:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def announce_termination(self, time: str = "2030-01-01T00:00:00Z", action: str = "terminate") -> None:
        self.instance_action = {"action": action, "time": time}

    def recommend_rebalance(self, notice_time: str = "2030-01-01T00:00:00Z") -> None:
        self.rebalance = {"noticeTime": notice_time}

    def expire_tokens(self) -> None:
        with self._lock:
            self.valid_tokens.clear()
