"""The instance metadata service (IMDSv2): the user data and the facts about this instance.

A session token from `PUT /latest/api/token`, then GETs carrying it; an expired token (401) is
renewed and transient failures are retried. The endpoint is `$AWS_EC2_METADATA_SERVICE_ENDPOINT`
(the local cloud's fake IMDS) or EC2's link-local address.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from typing import Any

from gpujobs.instance.errors import BootstrapError


class Imds:
    """IMDSv2 client: a session token from PUT /latest/api/token, then GETs carrying it."""

    def __init__(self, endpoint: str | None = None, *, tries: int = 5, timeout: float = 2.0) -> None:
        default = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or "http://169.254.169.254"
        self.endpoint = (endpoint or default).rstrip("/")
        if not self.endpoint.startswith(("http://", "https://")):
            raise BootstrapError(f"IMDS endpoint {self.endpoint!r} is not http(s)")
        self.tries, self.timeout = tries, timeout
        self._token: str | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _call(self, method: str, path: str, headers: dict[str, str]) -> bytes:
        for attempt in range(self.tries):
            try:
                request = urllib.request.Request(self.endpoint + path, method=method, headers=headers)  # noqa: S310
                with self._opener.open(request, timeout=self.timeout) as response:
                    body: bytes = response.read()
                    return body
            except urllib.error.HTTPError as exc:
                if exc.code == 404 or attempt == self.tries - 1:
                    raise BootstrapError(f"IMDS {method} {path}: HTTP {exc.code}") from exc
                if exc.code == 401:
                    self._token = None
            except OSError as exc:
                if attempt == self.tries - 1:
                    raise BootstrapError(f"IMDS {method} {path}: {exc}") from exc
            time.sleep(min(2**attempt, 5) / 4)
        raise AssertionError("unreachable")

    def get(self, path: str) -> bytes:
        if self._token is None:
            ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}
            self._token = self._call("PUT", "/latest/api/token", ttl).decode()
        return self._call("GET", path, {"X-aws-ec2-metadata-token": self._token})

    def spot_notice(self) -> bool:
        """Spot has announced this instance's interruption (`spot/instance-action`; 404: none)."""
        try:
            self.get("/latest/meta-data/spot/instance-action")
        except BootstrapError:
            return False
        return True

    def facts(self) -> dict[str, Any]:
        """instance_id, instance_type, launch_index, local_ipv4 and region of this instance."""
        meta = {
            k: self.get("/latest/meta-data/" + k).decode().strip()
            for k in ("instance-id", "instance-type", "ami-launch-index", "local-ipv4", "placement/region")
        }
        return {
            "instance_id": meta["instance-id"],
            "instance_type": meta["instance-type"],
            "launch_index": int(meta["ami-launch-index"]),
            "local_ipv4": meta["local-ipv4"],
            "region": meta["placement/region"],
        }
