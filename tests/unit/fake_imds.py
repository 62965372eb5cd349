"""A fake IMDSv2 on 127.0.0.1: a token from PUT /latest/api/token is required for every GET."""

from __future__ import annotations

import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType


class FakeImds:
    def __init__(
        self,
        *,
        user_data: bytes,
        instance_id: str = "i-0123456789abcdef0",
        launch_index: int = 0,
        local_ipv4: str = "10.0.0.5",
        region: str = "us-east-1",
    ) -> None:
        self.token = secrets.token_hex(8)
        self.paths = {
            "/latest/user-data": user_data,
            "/latest/meta-data/instance-id": instance_id.encode(),
            "/latest/meta-data/ami-launch-index": str(launch_index).encode(),
            "/latest/meta-data/local-ipv4": local_ipv4.encode(),
            "/latest/meta-data/placement/region": region.encode(),
        }
        self.unauthorized_gets = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._reply(200, imds.token.encode())
                else:
                    self._reply(400)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != imds.token:
                    imds.unauthorized_gets += 1
                    self._reply(401)
                elif self.path in imds.paths:
                    self._reply(200, imds.paths[self.path])
                else:
                    self._reply(404)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def __enter__(self) -> FakeImds:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
