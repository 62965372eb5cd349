"""The step-boundary decision on the ranks' agreed view, and the watcher looking at once (no torchrun).

`coalescing.decide` is pure: every rank calls it on the same all-reduced values, so these cases are
what every rank of a job does together.
"""

from __future__ import annotations

import time

import pytest

from gpujobs_trainer.coalescing import Agreed, Verdict, decide
from gpujobs_trainer.interruption import ImdsClient, ImdsWatcher, StopFlags
from tests.training.harness import FakeImds

WINDOW = 2.0


def _decide(
    *,
    preempt: bool = False,
    waited_s: float | None = None,
    periodic: bool = False,
    in_flight: bool = False,
    step: int = 7,
) -> tuple[Verdict, bool]:
    waited_ms = 0 if waited_s is None else 1 + int(waited_s * 1000)
    agreed = Agreed(preempt=preempt, oldest_request_ms=waited_ms, periodic_due=periodic, save_in_flight=in_flight)
    return decide(agreed, step=step, every_steps=50, coalesce_seconds=WINDOW)


def test_a_fresh_checkpoint_request_waits_for_a_preemption_to_join_it() -> None:
    assert _decide(waited_s=0.0) == (Verdict.CONTINUE, False)
    assert _decide(waited_s=WINDOW - 0.01) == (Verdict.CONTINUE, False)


def test_a_request_nobody_joined_within_the_window_saves_once() -> None:
    assert _decide(waited_s=WINDOW) == (Verdict.SAVE_ON_DEMAND, True)


def test_a_preemption_takes_over_the_pending_requests_in_one_save() -> None:
    assert _decide(preempt=True, waited_s=0.5) == (Verdict.STOP, True)
    assert _decide(preempt=True, waited_s=WINDOW * 10, in_flight=True) == (Verdict.STOP, True)


def test_a_request_arriving_while_a_save_is_in_flight_is_served_by_it() -> None:
    assert _decide(waited_s=0.1, in_flight=True) == (Verdict.CONTINUE, True)
    assert _decide(waited_s=WINDOW * 10, in_flight=True) == (Verdict.CONTINUE, True)


def test_a_periodic_save_serves_the_requests_waiting_for_their_window() -> None:
    assert _decide(waited_s=0.1, periodic=True) == (Verdict.SAVE_PERIODIC, True)
    assert _decide(waited_s=0.1, step=100) == (Verdict.SAVE_PERIODIC, True)  # every 50 steps


def test_nothing_asked_nothing_done() -> None:
    assert _decide() == (Verdict.CONTINUE, False)
    assert _decide(in_flight=True) == (Verdict.CONTINUE, False)


def test_requests_are_served_oldest_first_and_later_ones_stay_pending() -> None:
    flags = StopFlags()
    flags.request_checkpoint()
    count, oldest = flags.pending_requests()
    flags.request_checkpoint()  # arrives during the decision
    flags.serve_requests(count)
    assert flags.checkpoint_now
    left, newer = flags.pending_requests()
    assert left == 1
    assert oldest is not None
    assert newer is not None
    assert newer >= oldest


@pytest.mark.timeout(30)
def test_a_checkpoint_request_makes_the_watcher_look_at_the_notice_at_once() -> None:
    with FakeImds() as imds:
        flags = StopFlags()
        watcher = ImdsWatcher(ImdsClient(imds.endpoint, timeout=0.5), flags, interval=3600, required=True)
        watcher.start()
        try:
            deadline = time.monotonic() + 5
            while not imds.requests and time.monotonic() < deadline:  # the first poll, then an hour's sleep
                time.sleep(0.01)
            imds.announce_termination()
            asked_at = time.monotonic()
            flags.request_checkpoint()  # what SIGUSR1's handler does
            while not flags.preempt and time.monotonic() < deadline:
                time.sleep(0.01)
            seconds = time.monotonic() - asked_at
        finally:
            watcher.stop()
    assert flags.preempt
    assert seconds < 1.0
