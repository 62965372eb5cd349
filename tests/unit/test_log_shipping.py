"""The bootstrap's log shipper: every line reaches its stream, in order, in batches CloudWatch accepts.

moto checks order but not sizes (it took a 1 MiB event), so the batching limits are checked on the
batches themselves and the delivery against moto.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.instance.cloudwatch_logs import (
    EVENT_OVERHEAD_BYTES,
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    MAX_BATCH_SPAN_MS,
    MAX_EVENT_BYTES,
    LogShipper,
    batches,
    fit_message,
    pump,
)

GROUP = "/gpujobs/test/jobs"
STREAM = "j-0123456789abcdef/1/0"


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("logs", region_name="us-east-1")
        client.create_log_group(logGroupName=GROUP)
        yield client


def stored(client: Any, stream: str = STREAM) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    token = None
    while True:
        ask: dict[str, Any] = {"logGroupName": GROUP, "logStreamName": stream, "startFromHead": True}
        page = client.get_log_events(**ask, **({"nextToken": token} if token else {}))
        events += page["events"]
        if page["nextForwardToken"] == token:
            return events
        token = page["nextForwardToken"]


def cost(batch: list[dict[str, Any]]) -> int:
    return sum(len(e["message"].encode()) + EVENT_OVERHEAD_BYTES for e in batch)


def test_batches_stay_within_the_event_count_byte_and_span_limits_and_keep_order() -> None:
    many_small = [(1_000 + i, f"line {i}") for i in range(25_000)]
    few_large = [(1_000 + i, "x" * 200_000) for i in range(12)]
    a_day_apart = [(0, "first"), (MAX_BATCH_SPAN_MS - 1, "same day"), (MAX_BATCH_SPAN_MS, "next day")]

    small = list(batches(many_small))
    large = list(batches(few_large))
    days = list(batches(a_day_apart))

    assert [len(b) for b in small] == [MAX_BATCH_EVENTS, MAX_BATCH_EVENTS, 5_000]
    assert [e["message"] for b in small for e in b] == [m for _, m in many_small]
    assert all(cost(b) <= MAX_BATCH_BYTES for b in large)
    assert sum(len(b) for b in large) == 12
    assert [len(b) for b in large] == [5, 5, 2]
    assert [[e["message"] for e in b] for b in days] == [["first", "same day"], ["next day"]]


def test_a_line_longer_than_an_event_is_cut_at_a_character_boundary() -> None:
    snowmen = "\u2603" * MAX_EVENT_BYTES  # three bytes each

    cut = fit_message(snowmen + "\n")

    assert len(cut.encode()) <= MAX_EVENT_BYTES
    assert set(cut) == {"\u2603"}
    assert fit_message("step 1\r\n") == "step 1"


def test_lines_written_before_the_stream_is_known_are_sent_first_then_the_rest_in_order(logs: Any) -> None:
    shipper = LogShipper(lambda: logs, interval=0.05)
    shipper.write("before the rendezvous\n")
    shipper.write("")  # CloudWatch refuses an empty event: skipped

    shipper.open(GROUP, STREAM)
    for i in range(12_000):
        shipper.write(f"step {i}")
    shipper.close()

    events = stored(logs)
    assert [e["message"] for e in events] == ["before the rendezvous", *(f"step {i}" for i in range(12_000))]
    assert [e["timestamp"] for e in events] == sorted(e["timestamp"] for e in events)


def test_a_stream_that_cannot_be_written_is_said_on_stderr_and_never_raised(
    logs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    shipper = LogShipper(lambda: logs, interval=0.01, tries=2, backoff=0.01)
    shipper.write("lost")

    shipper.open("/gpujobs/no-such-group/jobs", STREAM)
    shipper.close()

    assert "create_log_stream to /gpujobs/no-such-group/jobs" in capsys.readouterr().err


def test_the_workload_output_is_echoed_and_shipped_line_by_line(logs: Any) -> None:
    shipper = LogShipper(lambda: logs, interval=0.05)
    shipper.open(GROUP, STREAM)
    echo = io.BytesIO()

    pump(io.BytesIO(b"epoch 1\nloss 0.5\ncaf\xc3\xa9\n"), echo=echo, shipper=shipper)
    shipper.close()

    assert echo.getvalue() == b"epoch 1\nloss 0.5\ncaf\xc3\xa9\n"
    assert [e["message"] for e in stored(logs)] == ["epoch 1", "loss 0.5", "caf\u00e9"]
