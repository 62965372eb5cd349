"""The moto server the local cloud runs on, and the process environment that points at it.

`MotoServer.start()` runs moto's WSGI app on 127.0.0.1 (a free port) behind `LoopbackOnly`, resets
it (moto's state is per process, so every start begins from an empty account) and points this
process at it: `AWS_ENDPOINT_URL`, credentials generated for this run and the Lambda-like
environment in `PROCESS_ENV`, with any profile or session token of the real account removed.
`stop()` stops the server and gives the process back the environment it had before, exactly.
Clients made by `client()` carry the run's credentials themselves, so they work from any thread
whatever the environment says.

moto answers anything that reaches it, including its reset and dashboard APIs, and a web page in
the user's browser can reach 127.0.0.1. `LoopbackOnly` refuses (403) a request from a peer that is
not loopback, one that carries an ``Origin`` header (browsers add it to cross-site requests and to
every POST), and one whose ``Host`` is not a loopback name (a DNS-rebound page sends its own name,
and no ``Origin`` on a same-origin GET). The credentials are random per run rather than a fixed,
documented pair; moto does not check them unless its IAM enforcement is switched on.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import threading
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

import boto3

from gpujobs_local.stack import REGION

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
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def run_credentials() -> dict[str, str]:
    """A fresh access key pair for one run of the local cloud."""
    return {
        "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
    }


def _is_loopback_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _is_loopback_host(host: str) -> bool:
    """A ``Host`` header naming a loopback address, localhost or a name under it (S3 virtual-host
    style: ``bucket.localhost``; browsers resolve ``*.localhost`` to loopback themselves, never
    through DNS, so a rebound page cannot use one), with or without a port."""
    name = host.lower()
    if name.startswith("["):  # [::1] or [::1]:port
        name = name[1 : name.find("]")]
    elif name.count(":") == 1:  # name:port
        name = name.split(":")[0]
    return name == "localhost" or name.endswith(".localhost") or _is_loopback_address(name)


class LoopbackOnly:
    """WSGI middleware: only requests a local program made reach the wrapped app; others get 403."""

    def __init__(self, app: WsgiApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        reason = self.refusal(environ)
        if not reason:
            return self.app(environ, start_response)
        body = f"refused by the local cloud: {reason}\n".encode()
        start_response("403 Forbidden", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    @staticmethod
    def refusal(environ: dict[str, Any]) -> str:
        """Why a request may not reach moto ('' when it may)."""
        peer = str(environ.get("REMOTE_ADDR", ""))
        if not _is_loopback_address(peer):
            return f"peer {peer or '(unknown)'} is not loopback"
        if "HTTP_ORIGIN" in environ:
            return "requests with an Origin header (from a web page) are not accepted"
        host = str(environ.get("HTTP_HOST", ""))
        if not _is_loopback_host(host):
            return f"Host {host or '(none)'} is not a loopback name"
        return ""


class MotoServer:
    """One moto server on loopback, and this process's environment while it runs."""

    def __init__(self, *, region: str = REGION) -> None:
        self.region = region
        self.endpoint_url = ""  # kept after stop(), so a caller can check that the port is closed
        self.credentials: dict[str, str] = {}  # this run's, set by start()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._saved_env: dict[str, str] | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Start the server and point this process at it; on failure leave everything as it was."""
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._saved_env = dict(os.environ)
        app = LoopbackOnly(DomainDispatcherApplication(create_backend_app))
        self._server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-server", daemon=True)
        self._thread.start()
        try:
            host, port = self._server.server_address[:2]
            self.endpoint_url = f"http://{host}:{port}"
            self.credentials = run_credentials()
            self.reset()
            os.environ.update({"AWS_ENDPOINT_URL": self.endpoint_url, **self.credentials, **PROCESS_ENV})
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
            server.shutdown()
            server.server_close()
            if self._thread is not None:
                self._thread.join()
        finally:
            self._thread = None
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
            aws_access_key_id=self.credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.credentials["AWS_SECRET_ACCESS_KEY"],
            region_name=self.region,
        )
        # Any service by name: the stubs type client() per literal service name.
        return session.client(service, endpoint_url=self.endpoint_url, region_name=self.region)  # type: ignore[call-overload]
