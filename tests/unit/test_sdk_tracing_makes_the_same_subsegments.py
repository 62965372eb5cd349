"""With X-Ray SDK tracing on, building the Powertools Tracer on the first invocation (rather than at
import) sends the X-Ray daemon the same subsegments, annotations and metadata.

A traced handler and method run in a fresh interpreter as Lambda runs them (LAMBDA_TASK_ROOT, the
invocation's trace header, the daemon's address), twice with the Tracer built at import as
`Tracer()` was, and twice with `gpujobs.runtime.observability`'s tracer; a UDP socket standing in
for the daemon collects what each sends. Boto3's calls are answered by botocore's Stubber, which
answers after the X-Ray SDK's patch of the client has opened the call's subsegment.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE_HEADER = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
TRACED = """
import json, sys
sys.path.insert(0, {layer!r})
import boto3
from botocore.stub import Stubber

if sys.argv[1] == "at-import":
    from aws_lambda_powertools import Tracer

    tracer = Tracer()
else:
    from gpujobs.runtime.observability import tracer
print(json.dumps({{"sdk_imported_at_import": "aws_xray_sdk" in sys.modules}}))
client = boto3.client("sqs", region_name="us-east-1")


@tracer.capture_method
def record_handler(n):
    return client.get_queue_url(QueueName=f"q{{n}}")["QueueUrl"]


@tracer.capture_lambda_handler
def handler(event, context):
    return [record_handler(n) for n in event["queues"]]


with Stubber(client) as stub:
    for n in (0, 1, 0):
        stub.add_response("get_queue_url", {{"QueueUrl": f"https://q{{n}}"}}, {{"QueueName": f"q{{n}}"}})
    stub.add_client_error("get_queue_url", "AWS.SimpleQueueService.NonExistentQueue", expected_params={{"QueueName": "q9"}})
    handler({{"queues": [0, 1]}}, None)  # the cold start
    handler({{"queues": [0]}}, None)
    try:
        handler({{"queues": [9]}}, None)
    except Exception as error:
        print(json.dumps({{"raised": type(error).__name__}}))
"""


@pytest.fixture
def daemon() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        yield udp


def exceptions(cause: object) -> list[str] | str:
    """A cause names its exceptions, or (a string) the id of the exception a child recorded."""
    if isinstance(cause, dict):
        return [str(e.get("type")) for e in cause.get("exceptions", [])]
    return "a child's" if cause else []


def subsegments(udp: socket.socket) -> list[dict[str, Any]]:
    """What the daemon received, in order, without the ids and times that differ between runs."""
    udp.setblocking(False)
    received = []
    while True:
        try:
            header, body = udp.recv(65536).decode().split("\n", 1)
        except BlockingIOError:
            break
        assert json.loads(header) == {"format": "json", "version": 1}
        received.append(json.loads(body))
    names = {s["id"]: s["name"] for s in received}
    return [
        {
            "name": s["name"],
            "parent": names.get(s["parent_id"], "the invocation's segment"),
            "namespace": s.get("namespace"),
            "annotations": s.get("annotations"),
            "metadata": {ns: sorted(values) for ns, values in s.get("metadata", {}).items()},
            "aws": s.get("aws"),
            "error": s.get("error", False) or s.get("fault", False),
            "exceptions": exceptions(s.get("cause")),
        }
        for s in received
    ]


def traced_run(udp: socket.socket, built: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    env = {
        **os.environ,
        "LAMBDA_TASK_ROOT": str(ROOT / "functions" / "submit"),
        "POWERTOOLS_TRACE_DISABLED": "false",
        "POWERTOOLS_SERVICE_NAME": "gpujobs",
        "AWS_XRAY_DAEMON_ADDRESS": "{}:{}".format(*udp.getsockname()),
        "_X_AMZN_TRACE_ID": TRACE_HEADER,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    env.pop("AWS_XRAY_SDK_ENABLED", None)
    script = TRACED.format(layer=str(ROOT / "layers" / "gpujobs"))
    out = subprocess.run(
        [sys.executable, "-c", script, built], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    printed = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return printed, subsegments(udp)


def test_the_tracer_built_on_the_first_call_sends_what_the_tracer_built_at_import_sent(daemon: socket.socket) -> None:
    printed_then, sent_then = traced_run(daemon, "at-import")
    printed_now, sent_now = traced_run(daemon, "on-first-call")

    assert printed_then == [{"sdk_imported_at_import": True}, {"raised": "ClientError"}]
    assert printed_now == [{"sdk_imported_at_import": False}, {"raised": "ClientError"}]
    assert sent_now == sent_then
    handlers = [s for s in sent_now if s["name"] == "## handler"]
    assert [h["annotations"] for h in handlers] == [
        {"ColdStart": True, "Service": "gpujobs"},
        {"ColdStart": False, "Service": "gpujobs"},
        {"ColdStart": False, "Service": "gpujobs"},
    ]
    calls = [s for s in sent_now if s["namespace"] == "aws"]
    assert [(c["aws"]["operation"], c["aws"]["queue_name"], c["parent"]) for c in calls] == [
        ("GetQueueUrl", f"q{n}", "## __main__.record_handler") for n in (0, 1, 0, 9)
    ]
    assert calls[-1]["error"]
    assert handlers[-1]["metadata"] == {"gpujobs": ["handler error"]}
