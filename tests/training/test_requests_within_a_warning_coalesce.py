"""The step-boundary decision on the ranks' agreed view, and the watcher looking at once (no torchrun).

`coalescing.decide` is pure: every rank calls it on the same all-reduced values, so these cases are
what every rank of a job does together. A request saves at once; a preemption soon after a save
started joins it.
"""

from __future__ import annotations

import time

import pytest

from gpujobs_trainer.coalescing import COALESCE_SECONDS, Agreed, SaveCoordinator, Verdict, decide
from gpujobs_trainer.interruption import ImdsClient, ImdsWatcher, StopFlags
from tests.training.harness import FakeImds


def _decide(
    *,
    preempt: bool = False,
    waited_s: float | None = None,
    periodic: bool = False,
    in_flight: bool = False,
    fresh: bool = False,
    step: int = 7,
) -> tuple[Verdict, bool]:
    waited_ms = 0 if waited_s is None else 1 + int(waited_s * 1000)
    agreed = Agreed(
        preempt=preempt, oldest_request_ms=waited_ms, periodic_due=periodic, save_in_flight=in_flight, fresh_save=fresh
    )
    return decide(agreed, step=step, every_steps=50)


def test_a_checkpoint_request_saves_at_once() -> None:
    assert _decide(waited_s=0.0) == (Verdict.SAVE_ON_DEMAND, True)
    assert _decide(waited_s=5.0) == (Verdict.SAVE_ON_DEMAND, True)


def test_a_preemption_just_after_a_save_started_joins_it() -> None:
    assert _decide(preempt=True, fresh=True, in_flight=True) == (Verdict.JOIN, True)
    assert _decide(preempt=True, fresh=True) == (Verdict.JOIN, True)  # committed already: that is the checkpoint
    assert _decide(preempt=True, fresh=True, waited_s=0.1) == (Verdict.JOIN, True)


def test_a_preemption_long_after_the_last_save_started_saves_the_steps_since() -> None:
    assert _decide(preempt=True, waited_s=0.5) == (Verdict.STOP, True)
    assert _decide(preempt=True, in_flight=True) == (Verdict.STOP, True)


def test_a_request_arriving_while_a_save_is_in_flight_is_served_by_it() -> None:
    assert _decide(waited_s=0.1, in_flight=True) == (Verdict.CONTINUE, True)
    assert _decide(waited_s=10.0, in_flight=True, fresh=True) == (Verdict.CONTINUE, True)


def test_a_request_and_a_periodic_save_due_together_make_one_save() -> None:
    assert _decide(waited_s=0.1, periodic=True) == (Verdict.SAVE_ON_DEMAND, True)
    assert _decide(step=100) == (Verdict.SAVE_PERIODIC, True)  # every 50 steps
    assert _decide(periodic=True) == (Verdict.SAVE_PERIODIC, True)


def test_nothing_asked_nothing_done() -> None:
    assert _decide() == (Verdict.CONTINUE, False)
    assert _decide(in_flight=True, fresh=True) == (Verdict.CONTINUE, False)


def test_the_window_to_join_is_counted_from_the_save_start_on_the_coordinators_clock() -> None:
    now = [100.0]
    flags = StopFlags()
    coordinator = SaveCoordinator(flags, all_reduce_max=lambda values: values, clock=lambda: now[0])
    coordinator.saved(40, started=now[0])
    flags.request_preempt("SIGTERM")
    now[0] += COALESCE_SECONDS - 0.01
    assert coordinator.at_step(41, periodic_due=False, every_steps=0, save_in_flight=True) is Verdict.JOIN
    now[0] += 0.02
    assert coordinator.at_step(42, periodic_due=False, every_steps=0, save_in_flight=False) is Verdict.STOP


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


def test_a_checkpoint_now_is_saved_at_the_first_step_boundary_after_it_not_two_seconds_later() -> None:
    """A kill right after the control plane's checkpoint-now used to find nothing newer committed."""
    flags = StopFlags()
    coordinator = SaveCoordinator(flags, all_reduce_max=lambda values: values)  # the clock the flags use
    flags.request_checkpoint()
    assert coordinator.at_step(7, periodic_due=False, every_steps=0, save_in_flight=False) is Verdict.SAVE_ON_DEMAND
    assert not flags.checkpoint_now  # served by that save
