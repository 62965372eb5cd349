"""The moto server the local cloud runs on, and the process environment that points at it.

`MotoServer.start()` runs `moto.server.ThreadedMotoServer` on 127.0.0.1 (a free port), resets it
(moto's state is per process, so every start begins from an empty account) and points this process
at it: `AWS_ENDPOINT_URL`, fake credentials and the Lambda-like environment in `PROCESS_ENV`, with
any profile or session token of the real account removed. `stop()` stops the server and gives the
process back the environment it had before, exactly. Clients made by `client()` carry the fake
credentials themselves, so they work from any thread whatever the environment says.
"""

from __future__ import annotations

import logging
import os
import urllib.request
from typing import Any

import boto3

from gpujobs_local.stack import REGION

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
PROCESS_ENV = {
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
    "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "GpuJobs",
    "POWERTOOLS_SERVICE_NAME": "gpujobs",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}


class MotoServer:
    """One moto server on loopback, and this process's environment while it runs."""

    def __init__(self, *, region: str = REGION) -> None:
        self.region = region
        self.endpoint_url = ""  # kept after stop(), so a caller can check that the port is closed
        self._server: Any = None
        self._saved_env: dict[str, str] | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Start the server and point this process at it; on failure leave everything as it was."""
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._saved_env = dict(os.environ)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        self._server = server
        try:
            host, port = server.get_host_and_port()
            self.endpoint_url = f"http://{host}:{port}"
            self.reset()
            os.environ.update({"AWS_ENDPOINT_URL": self.endpoint_url, **FAKE_CREDENTIALS, **PROCESS_ENV})
            for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
                os.environ.pop(key, None)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server and restore the environment this process had before start()."""
        server, self._server = self._server, None
        if server is None:
            return
        try:
            server.stop()
        finally:
            if self._saved_env is not None:
                os.environ.clear()
                os.environ.update(self._saved_env)
                self._saved_env = None

    def reset(self) -> None:
        """Empty moto's account: every resource of every service goes."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST", data=b"")  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback only
            response.read()

    def client(self, service: str) -> Any:
        """A boto3 client for the server (its own session: safe from any thread)."""
        session = boto3.session.Session(
            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=self.region,
        )
        # Any service by name: the stubs type client() per literal service name.
        return session.client(service, endpoint_url=self.endpoint_url, region_name=self.region)  # type: ignore[call-overload]
