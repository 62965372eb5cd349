"""A fake IMDSv2 on 127.0.0.1: what a local instance (and the trainer's watcher) asks its metadata service.

A session token from ``PUT /latest/api/token`` (with a TTL header) is required for every GET. It serves
``/latest/user-data``, any ``/latest/meta-data/<path>`` given in ``metadata``, and the two spot signals:
``spot/instance-action`` and ``events/recommendations/rebalance`` (JSON, 404 until set), as on EC2
(docs: aws-contracts §1.9). ``instance_role_metadata`` gives it an instance profile's credentials.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

from gpujobs_local.serving import LocalServer

SPOT_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"


def instance_role_metadata(role_name: str, credentials: Mapping[str, Any]) -> dict[str, str]:
    """``metadata`` serving an instance profile's session (STS ``Credentials``) as EC2's IMDS does:
    ``iam/security-credentials/`` names the role, ``iam/security-credentials/<role>`` is its keys."""
    expiration = credentials["Expiration"]
    if isinstance(expiration, dt.datetime):
        expiration = expiration.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    served = {
        "Code": "Success",
        "LastUpdated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "Type": "AWS-HMAC",
        "AccessKeyId": credentials["AccessKeyId"],
        "SecretAccessKey": credentials["SecretAccessKey"],
        "Token": credentials["SessionToken"],
        "Expiration": str(expiration),
    }
    prefix = "iam/security-credentials/"
    return {prefix: role_name, prefix + role_name: json.dumps(served)}


class FakeImds(LocalServer):
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
        self.credentials_missing_for = 0
        """How many more GETs of the instance profile's credentials answer 404, as IMDS can right after
        a launch before it serves the profile (a test sets it)."""
        self._counter = 0
        self._lock = threading.Lock()
        super().__init__(self._handler(), host=host, name="fake-imds")

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
        if path.startswith(prefix + "iam/security-credentials/") and self.credentials_missing_for > 0:
            with self._lock:
                self.credentials_missing_for -= 1
            return None
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

    def announce_termination(self, time: str = "2030-01-01T00:00:00Z", action: str = "terminate") -> None:
        self.instance_action = {"action": action, "time": time}

    def recommend_rebalance(self, notice_time: str = "2030-01-01T00:00:00Z") -> None:
        self.rebalance = {"noticeTime": notice_time}

    def expire_tokens(self) -> None:
        with self._lock:
            self.valid_tokens.clear()
