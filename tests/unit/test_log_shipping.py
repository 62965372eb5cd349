"""The bootstrap's log shipper: every line reaches its stream, in order, in batches CloudWatch accepts.

moto checks order but not sizes (it took a 1 MiB event), so the batching limits are checked on the
batches themselves and the delivery against moto.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
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
    # the shipper's calls are the instance role's (tests/call_ledger.py): GROUP is the stack's job log group
    monkeypatch.setenv("JOB_LOG_GROUP", GROUP)
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
    logs: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOB_LOG_GROUP", "/gpujobs/no-such-group/jobs")  # the stack's group, deleted
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


# ---- a throttled or failing stream ----------------------------------------------------------------
def _throttled(operation: str) -> ClientError:
    return ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, operation)


class FakeLogs:
    """CloudWatch Logs that throttles the first `throttle_creates` CreateLogStream and
    `throttle_puts` PutLogEvents calls (-1: every one), and keeps what it accepts."""

    def __init__(self, *, throttle_creates: int = 0, throttle_puts: int = 0) -> None:
        self.throttle_creates, self.throttle_puts = throttle_creates, throttle_puts
        self.streams: list[str] = []
        self.messages: list[str] = []

    def create_log_stream(self, *, logGroupName: str, logStreamName: str) -> None:  # noqa: N803 - boto3's names
        if self.throttle_creates:
            self.throttle_creates -= 1
            raise _throttled("CreateLogStream")
        self.streams.append(logStreamName)

    def put_log_events(self, *, logGroupName: str, logStreamName: str, logEvents: list[dict[str, Any]]) -> None:  # noqa: N803
        if self.throttle_puts:
            self.throttle_puts -= 1
            raise _throttled("PutLogEvents")
        self.messages += [e["message"] for e in logEvents]


def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for the shipper's thread to get there (close() would cut its retries short)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the shipper never got there"
        time.sleep(0.005)


class Sleeps(list[float]):
    """The shipper's backoff, recorded instead of slept."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def test_a_stream_throttled_for_longer_than_the_old_retries_is_created_and_every_line_shipped() -> None:
    # given CreateLogStream throttled 12 times in a row (the old shipper gave up after 3.5 s of it)
    logs, sleeps = FakeLogs(throttle_creates=12), Sleeps()
    shipper = LogShipper(lambda: logs, interval=0.01, backoff=0.5, max_backoff=20, sleep=sleeps)
    shipper.write("bootstrap starting")

    # when the node ships its log
    shipper.open(GROUP, STREAM)
    for i in range(50):
        shipper.write(f"line {i}")
    until(lambda: len(logs.messages) == 51)
    shipper.close()

    # then the stream exists and holds every line, in order, after a capped exponential backoff
    assert logs.streams == [STREAM]
    assert logs.messages == ["bootstrap starting", *(f"line {i}" for i in range(50))]
    assert sleeps == [min(20.0, 0.5 * 2**n) for n in range(12)]
    assert sum(sleeps) > 3.5
    assert shipper.dropped == 0


def test_a_throttled_put_keeps_its_lines_until_it_passes() -> None:
    logs, sleeps = FakeLogs(throttle_puts=9), Sleeps()
    shipper = LogShipper(lambda: logs, interval=0.01, sleep=sleeps)
    shipper.open(GROUP, STREAM)
    for i in range(20):
        shipper.write(f"step {i}")
    until(lambda: len(logs.messages) == 20)
    shipper.close()

    assert logs.messages == [f"step {i}" for i in range(20)]
    assert len(sleeps) == 9
    assert shipper.dropped == 0


def test_a_full_queue_drops_the_oldest_lines_and_the_stream_says_how_many() -> None:
    # given a node whose stream is not known yet, writing more than the queue holds
    logs = FakeLogs()
    shipper = LogShipper(lambda: logs, interval=0.01, max_lines=100, sleep=Sleeps())
    for i in range(250):
        shipper.write(f"line {i}")

    # when the stream opens
    shipper.open(GROUP, STREAM)
    shipper.close()

    # then the newest 100 lines are shipped after one line that counts the 150 dropped
    assert shipper.dropped == 150
    note, *kept = logs.messages
    assert "150 log line(s) dropped" in note
    assert kept == [f"line {i}" for i in range(150, 250)]


def test_a_queue_bounded_by_bytes_keeps_its_size() -> None:
    shipper = LogShipper(FakeLogs, max_bytes=10_000, sleep=Sleeps())
    for _ in range(100):
        shipper.write("x" * 974)  # 1,000 bytes with the event overhead
    assert shipper.dropped == 90


def test_lines_a_stream_throttled_to_the_end_could_not_take_are_counted_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs = FakeLogs(throttle_creates=-1)
    shipper = LogShipper(lambda: logs, interval=0.01, sleep=Sleeps())
    shipper.open(GROUP, STREAM)
    for i in range(7):
        shipper.write(f"line {i}")
    shipper.close()

    assert logs.streams == []
    assert shipper.dropped == 7
    assert "7 lines dropped in all" in capsys.readouterr().err


def test_a_stream_throttled_for_thousands_of_tries_keeps_backing_off_at_the_cap() -> None:
    # given CreateLogStream throttled 2,000 times (hours at the 20 s cap on a real instance)
    logs, sleeps = FakeLogs(throttle_creates=2000), Sleeps()
    shipper = LogShipper(lambda: logs, interval=0.01, backoff=0.5, max_backoff=20, sleep=sleeps)
    shipper.write("still here")

    shipper.open(GROUP, STREAM)
    until(lambda: logs.messages == ["still here"])
    shipper.close()

    # then the shipper outlived them (2**1024 as a float overflowed and ended its thread)
    assert logs.streams == [STREAM]
    assert len(sleeps) == 2000
    assert sleeps[-1] == 20
