"""The local cloud's moto server answers only programs on this machine, never a web page.

A page in the user's browser can send requests to 127.0.0.1 (a cross-site form POST carries an
``Origin`` header; a DNS-rebound page sends its own name as ``Host``), and a server bound to
another interface could be reached from the network. The middleware is tested as a WSGI unit for
peers this machine may not have; the server itself with real HTTP requests.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpujobs_local.moto_server import LoopbackOnly, MotoServer

pytestmark = pytest.mark.integration


class _App:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        self.calls += 1
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"moto"]


def _call(environ: dict[str, Any]) -> tuple[str, bytes, int]:
    app = _App()
    statuses: list[str] = []
    body = b"".join(LoopbackOnly(app)(environ, lambda status, headers: statuses.append(status)))
    return statuses[0], body, app.calls


def _environ(**overrides: str) -> dict[str, Any]:
    return {"REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "127.0.0.1:5000", **overrides}


@pytest.mark.parametrize(
    "environ",
    [_environ(), _environ(REMOTE_ADDR="::1", HTTP_HOST="[::1]:5000"), _environ(REMOTE_ADDR="::ffff:127.0.0.1")]
    + [
        _environ(HTTP_HOST=host)
        for host in ("localhost:5000", "LOCALHOST", "bucket.localhost:5000", "127.0.0.1", "127.8.9.10:1")
    ],
)
def test_a_local_program_reaches_moto(environ: dict[str, Any]) -> None:
    assert _call(environ) == ("200 OK", b"moto", 1)


@pytest.mark.parametrize(
    ("environ", "reason"),
    [
        (_environ(REMOTE_ADDR="10.1.2.3"), "peer 10.1.2.3 is not loopback"),
        (_environ(REMOTE_ADDR="192.168.1.20"), "peer 192.168.1.20 is not loopback"),
        (_environ(REMOTE_ADDR="2001:db8::1"), "peer 2001:db8::1 is not loopback"),
        (_environ(REMOTE_ADDR=""), "peer (unknown) is not loopback"),
        (_environ(HTTP_ORIGIN="https://attacker.example"), "Origin header"),
        (_environ(HTTP_ORIGIN="null"), "Origin header"),
        (_environ(HTTP_HOST="attacker.example:5000"), "Host attacker.example:5000 is not a loopback name"),
        (_environ(HTTP_HOST="localhost.attacker.example"), "is not a loopback name"),
        (_environ(HTTP_HOST=""), "Host (none) is not a loopback name"),
    ],
)
def test_anything_else_is_refused_before_it_reaches_moto(environ: dict[str, Any], reason: str) -> None:
    status, body, calls = _call(environ)
    assert status == "403 Forbidden"
    assert reason in body.decode()
    assert calls == 0


@pytest.fixture
def server() -> Iterator[MotoServer]:
    moto = MotoServer()
    moto.start()
    try:
        yield moto
    finally:
        moto.stop()


def _status(url: str, **headers: str) -> int:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_server_refuses_a_request_from_a_web_page(server: MotoServer) -> None:
    dashboard = f"{server.endpoint_url}/moto-api/data.json"  # every resource of every service
    assert _status(dashboard) == 200
    assert _status(dashboard, Origin="https://attacker.example") == 403
    port = server.endpoint_url.rsplit(":", 1)[1]
    assert _status(dashboard, Host=f"rebound.attacker.example:{port}") == 403


def test_each_run_has_its_own_credentials(server: MotoServer) -> None:
    other = MotoServer()
    other.start()
    try:
        assert other.credentials != server.credentials
        assert os.environ["AWS_ACCESS_KEY_ID"] == other.credentials["AWS_ACCESS_KEY_ID"]
    finally:
        other.stop()
    assert os.environ["AWS_ACCESS_KEY_ID"] == server.credentials["AWS_ACCESS_KEY_ID"]
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == server.credentials["AWS_SECRET_ACCESS_KEY"]
    assert "local" not in server.credentials.values()
    sqs = server.client("sqs")
    sqs.create_queue(QueueName="q")
    assert sqs.list_queues()["QueueUrls"][0].endswith("/q")
