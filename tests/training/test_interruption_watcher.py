"""The IMDSv2 watcher against a fake metadata service on 127.0.0.1 (no torchrun)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest

from gpujobs_trainer.interruption import ImdsClient, ImdsWatcher, StopFlags
from tests.training.harness import FakeImds


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with FakeImds() as server:
        yield server


def _watcher(endpoint: str, *, required: bool = True) -> tuple[ImdsWatcher, StopFlags]:
    flags = StopFlags()
    return ImdsWatcher(ImdsClient(endpoint, timeout=0.5), flags, interval=0.05, required=required), flags


def test_nothing_scheduled_means_no_flag(imds: FakeImds) -> None:
    watcher, flags = _watcher(imds.endpoint)
    watcher.poll_once()
    assert not flags.preempt
    assert not flags.checkpoint_now
    assert imds.requests[0] == ("PUT", "/latest/api/token")


def test_a_spot_termination_notice_asks_for_a_final_checkpoint_and_stop(imds: FakeImds) -> None:
    watcher, flags = _watcher(imds.endpoint)
    watcher.start()
    imds.announce_termination()
    deadline = time.monotonic() + 5
    while not flags.preempt and time.monotonic() < deadline:
        time.sleep(0.02)
    watcher.stop()
    assert flags.preempt
    assert "terminate" in flags.preempt_reason


def test_a_rebalance_recommendation_asks_for_one_checkpoint_and_training_goes_on(imds: FakeImds) -> None:
    watcher, flags = _watcher(imds.endpoint)
    imds.recommend_rebalance()
    watcher.poll_once()
    assert flags.pending_requests()[0] == 1
    assert not flags.preempt
    watcher.poll_once()  # the same recommendation is not a new request
    assert flags.pending_requests()[0] == 1


def test_an_expired_token_is_refreshed_transparently(imds: FakeImds) -> None:
    watcher, flags = _watcher(imds.endpoint)
    watcher.poll_once()
    imds.expire_tokens()
    imds.announce_termination()
    watcher.poll_once()
    assert flags.preempt
    assert imds.requests.count(("PUT", "/latest/api/token")) == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_off_ec2_the_watcher_disables_itself_after_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpujobs_trainer")
    watcher, flags = _watcher(f"http://127.0.0.1:{_closed_port()}", required=False)
    watcher.start()
    watcher.stop()
    assert watcher.disabled
    assert not flags.preempt
    assert sum("interruption watcher disabled" in r.message for r in caplog.records) == 1


def test_an_explicitly_configured_endpoint_keeps_being_polled_through_an_outage() -> None:
    watcher, _ = _watcher(f"http://127.0.0.1:{_closed_port()}", required=True)
    watcher.start()
    time.sleep(0.3)
    alive = watcher._thread.is_alive()
    watcher.stop()
    assert alive
    assert not watcher.disabled
