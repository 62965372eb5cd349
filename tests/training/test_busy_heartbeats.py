"""Long phases are not hangs: inside ``run.busy()`` rank 0 keeps reporting heartbeats.

The control plane replaces a trainer whose heartbeats stop for the job's overdue limit. These
tests drive the trainer's `Heartbeat` directly with a recording publisher and a short period.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpujobs_trainer.events import TRAINING_HEARTBEAT
from gpujobs_trainer.heartbeat import Heartbeat

PERIOD = 0.05


class Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        assert detail_type == TRAINING_HEARTBEAT
        with self._lock:
            self.sent.append(detail)

    def close(self) -> None:
        """Nothing buffered."""


def heartbeat(recorder: Recorder, *, enabled: bool = True) -> Heartbeat:
    return Heartbeat(publisher=recorder, job_id="j-1", attempt=2, interval=PERIOD, samples_per_step=64, enabled=enabled)


def test_a_long_evaluation_keeps_reporting_the_step_it_started_at() -> None:
    recorder = Recorder()
    beat = heartbeat(recorder)
    beat.after_step(100)

    with beat.busy("eval"):
        time.sleep(PERIOD * 6)
    during = len(recorder.sent)
    time.sleep(PERIOD * 3)

    assert during >= 3
    assert len(recorder.sent) == during  # nothing after the block: the step boundary takes over again
    assert {(d["step"], d["busy"], d["job_id"], d["attempt"]) for d in recorder.sent} == {(100, "eval", "j-1", 2)}
    assert all(d["steps_per_second"] == 0.0 for d in recorder.sent)


def test_the_step_boundary_reports_at_most_once_a_period_with_the_rate() -> None:
    recorder = Recorder()
    beat = heartbeat(recorder)
    beat.restart_at(40)

    beat.after_step(41)  # too soon
    time.sleep(PERIOD * 2)
    beat.after_step(50)

    [report] = recorder.sent
    assert report["step"] == 50
    assert "busy" not in report
    assert 0 < report["steps_per_second"] <= 10 / (PERIOD * 2)
    assert report["samples_per_second"] == pytest.approx(report["steps_per_second"] * 64, rel=1e-3)


def test_nested_and_concurrent_blocks_share_one_keep_alive_that_ends_with_the_last() -> None:
    recorder = Recorder()
    beat = heartbeat(recorder)
    other_done = threading.Event()

    def save_in_background() -> None:
        with beat.busy("checkpoint"):
            time.sleep(PERIOD * 4)
        other_done.set()

    with beat.busy("eval"):
        thread = threading.Thread(target=save_in_background)
        thread.start()
        with beat.busy("compile"):
            time.sleep(PERIOD * 2)
    other_done.wait(5)
    thread.join(5)
    time.sleep(PERIOD * 2)
    settled = len(recorder.sent)
    time.sleep(PERIOD * 3)

    assert settled >= 3
    assert len(recorder.sent) == settled
    assert [t.name for t in threading.enumerate()].count("gpujobs-heartbeat") == 0


def test_other_ranks_and_jobs_without_reporting_send_nothing() -> None:
    recorder = Recorder()
    beat = heartbeat(recorder, enabled=False)

    with beat.busy("eval"):
        time.sleep(PERIOD * 3)
    beat.after_step(10)

    assert recorder.sent == []
