"""The host agent: the container's only way to credentials and instance metadata.

One HTTP server on the host's loopback (the container shares it through `--network host`) serves
* `GET /gpujobs/credentials`, the job's credentials in the container-credentials format botocore's
  `ContainerProvider` reads (`AWS_CONTAINER_CREDENTIALS_FULL_URI`), only with the per-attempt
  token in `Authorization` (other processes on the host share the loopback); and
* a filtered IMDSv2: the token `PUT` and the two notices the trainer's watcher polls (spot
  `instance-action`, rebalance recommendation), relayed from the real IMDS. Nothing else of the
  instance's metadata, and never the instance role's credentials, is served.
The container's control group cannot reach the real IMDS (`DockerRuntime.block_imds`,
`confinement.py`), so these two paths are all the metadata it has; the agent itself runs in the
bootstrap's group, which keeps IMDS. See docs/instance.md, "Per-job credentials".
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpujobs.instance.credentials import JobCredentials
from gpujobs.instance.imds import Imds
from gpujobs.instance.log import log

CREDENTIALS_PATH = "/gpujobs/credentials"
IMDS_TOKEN_PATH = "/latest/api/token"  # noqa: S105 (a URL path)
RELAYED_IMDS_PATHS = ("/latest/meta-data/spot/instance-action", "/latest/meta-data/events/recommendations/rebalance")
_FILTERED_TOKEN = b"gpujobs-filtered-imds"


class HostAgent:
    """Serves one attempt's credentials and the filtered IMDS on 127.0.0.1 (an ephemeral port)."""

    def __init__(self, credentials: JobCredentials, imds: Imds) -> None:
        self.credentials, self.imds = credentials, imds
        self.token = secrets.token_urlsafe(32)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> HostAgent:
        threading.Thread(target=self._server.serve_forever, name="gpujobs-host-agent", daemon=True).start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def workload_env(self) -> tuple[dict[str, str], dict[str, str]]:
        """(what the workload may see in its environment, what must travel privately: the token)."""
        public = {
            "AWS_CONTAINER_CREDENTIALS_FULL_URI": self.endpoint + CREDENTIALS_PATH,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",  # botocore's own IMDS lookups: defence in depth
        }
        return public, {"AWS_CONTAINER_AUTHORIZATION_TOKEN": self.token}

    def _answer(self, method: str, path: str, authorization: str) -> tuple[int, bytes]:
        if method == "PUT":
            return (200, _FILTERED_TOKEN) if path == IMDS_TOKEN_PATH else (404, b"")
        if path == CREDENTIALS_PATH:
            if not hmac.compare_digest(authorization.encode(), self.token.encode()):
                return 401, b""
            try:
                return 200, json.dumps(self.credentials.served()).encode()
            except Exception as exc:  # STS unreachable: the SDK keeps its credentials and asks again
                log(f"host agent: {exc}")
                return 503, b""
        if path in RELAYED_IMDS_PATHS:
            try:
                return 200, self.imds.get(path)
            except Exception:  # 404: nothing scheduled (the usual answer), or IMDS unreachable
                return 404, b""
        return 404, b""

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: requests are polled every few seconds."""

            def _reply(self, method: str) -> None:
                code, body = agent._answer(method, self.path, self.headers.get("Authorization", ""))
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._reply("GET")

            def do_PUT(self) -> None:
                self._reply("PUT")

        return Handler
