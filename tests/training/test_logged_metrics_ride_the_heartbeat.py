"""What a script logs (``run.log``, ``step_done(metrics=)``) rides rank 0's next heartbeat.

The control plane shows the newest values in ``gpujobs status`` and keeps a series for ``gpujobs
metrics``; a value that cannot be carried (not finite, not a number, a bad name, a ninth name) is
dropped with a warning, never raised into training. These drive the trainer's `Heartbeat` with a
recording publisher and a hand-moved clock.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from gpujobs_trainer.heartbeat import Heartbeat
from gpujobs_trainer.metrics import MAX_METRICS


class Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        self.sent.append(detail)

    def close(self) -> None:
        """Nothing buffered."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def beating(*, enabled: bool = True) -> tuple[Heartbeat, Recorder, Clock]:
    recorder, clock = Recorder(), Clock()
    beat = Heartbeat(
        publisher=recorder, job_id="j-1", attempt=1, interval=10, samples_per_step=32, enabled=enabled, clock=clock
    )
    return beat, recorder, clock


def test_the_next_heartbeat_carries_the_newest_value_of_each_logged_metric() -> None:
    beat, recorder, clock = beating()
    beat.record({"loss": torch.tensor(2.5), "lr": 0.1})
    beat.after_step(1)
    beat.record({"loss": torch.tensor(1.25, requires_grad=True) * 1})  # a loss still in its graph

    clock.now = 20
    beat.after_step(40)

    (sent,) = recorder.sent
    assert sent["step"] == 40
    assert sent["metrics"] == {"loss": 1.25, "lr": 0.1}
    assert sent["steps_per_second"] == pytest.approx(2.0)
    assert sent["samples_per_second"] == pytest.approx(64.0)


def test_a_value_that_cannot_be_carried_is_dropped_with_a_warning_and_training_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    beat, recorder, clock = beating()
    beat.record({"loss": float("nan"), "acc": "high", "bad name!": 1.0, "tokens": torch.tensor([1.0, 2.0]), "lr": 0.5})
    for step in (1, 2):
        clock.now += 11
        with caplog.at_level(logging.WARNING, logger="gpujobs_trainer"):
            beat.after_step(step)

    assert [d["metrics"] for d in recorder.sent] == [{"lr": 0.5}, {"lr": 0.5}]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 4  # one per name and reason, not one per heartbeat
    assert any("'loss'" in w and "not finite" in w for w in warnings)
    assert any("'acc'" in w and "not a number" in w for w in warnings)
    assert any("'bad name!'" in w for w in warnings)
    assert any("'tokens'" in w and "Tensor" in w for w in warnings)


def test_only_the_first_names_are_carried_and_values_keep_six_significant_digits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    beat, recorder, clock = beating()
    beat.record({f"m{i}": 1 / 3 for i in range(MAX_METRICS)})
    with caplog.at_level(logging.WARNING, logger="gpujobs_trainer"):
        beat.record({"one_too_many": 1.0, "m0": 123456789.0})
    clock.now = 11
    beat.after_step(1)

    (sent,) = recorder.sent
    assert len(sent["metrics"]) == MAX_METRICS
    assert "one_too_many" not in sent["metrics"]
    assert sent["metrics"]["m0"] == 123457000.0
    assert sent["metrics"]["m1"] == 0.333333
    assert "only 8 metrics" in caplog.text


def test_other_ranks_keep_nothing_and_read_no_tensor() -> None:
    class Unreadable:
        ndim = 0

        def item(self) -> float:
            raise AssertionError("a rank that does not report read a metric")

    beat, recorder, clock = beating(enabled=False)
    beat.record({"loss": Unreadable()})
    clock.now = 11
    beat.after_step(1)

    assert recorder.sent == []
