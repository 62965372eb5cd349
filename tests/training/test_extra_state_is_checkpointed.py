"""Stories of the script's own state (``init(state=...)``) going through a checkpoint and back.

Single process, gloo over a FileStore: no torchrun, no network port. The 2-rank stories (per-rank
state coming back to its own rank, buffers saved from rank 0) are in
test_a_real_training_loop_resumes_exactly.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gpujobs_trainer import per_rank
from gpujobs_trainer.checkpoint import CheckpointManager, TrainingState
from gpujobs_trainer.distributed import DistEnv
from gpujobs_trainer.extra_state import ExtraState
from gpujobs_trainer.storage import LocalStore

pytestmark = [pytest.mark.training, pytest.mark.timeout(120)]

ENV = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.fixture
def single_process_group(tmp_path: Path) -> Iterator[None]:
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "pg-store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Tracker:
    """A best-metric tracker with a fixed key set."""

    def __init__(self) -> None:
        self.best = float("inf")
        self.history: dict[str, float] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]


class GrowingTracker(Tracker):
    """A tracker whose state_dict() gains keys as training runs: a fresh one has none of them."""

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, **{f"epoch{k}": v for k, v in self.history.items()}}


def _objects(tracker: Tracker) -> tuple[TrainingState, dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    extras = {
        "scaler": torch.amp.GradScaler("cpu", init_scale=8.0),
        "ema": nn.Linear(4, 2),
        "best": tracker,
        "seen": per_rank(Tracker()),
    }
    return TrainingState(model, optimizer, None, ExtraState(extras, rank=0)), extras


def _save_then_restore(tmp_path: Path, state: TrainingState, fresh: TrainingState) -> None:
    store = LocalStore(tmp_path / "checkpoints")
    manager = CheckpointManager(store=store, env=ENV, state=state)
    try:
        assert manager.save(step=7, reason="periodic", position={}, blocking=True).result().committed
    finally:
        manager.close()
    restorer = CheckpointManager(store=store, env=ENV, state=fresh)
    try:
        assert restorer.restore() is not None
    finally:
        restorer.close()


def test_scaler_ema_tracker_and_per_rank_state_come_back_with_the_checkpoint(
    tmp_path: Path, single_process_group: None
) -> None:
    state, saved = _objects(Tracker())
    saved["scaler"].scale(torch.ones(()))  # a scaler's scale exists once it has scaled a loss
    saved["scaler"].update(new_scale=32.0)
    with torch.no_grad():
        saved["ema"].weight.fill_(0.5)
    saved["best"].best = 0.25
    saved["seen"].target.best = 3.0
    fresh_state, fresh = _objects(Tracker())

    _save_then_restore(tmp_path, state, fresh_state)

    assert fresh["scaler"].get_scale() == 32.0
    assert torch.equal(fresh["ema"].weight, torch.full((2, 4), 0.5))
    assert fresh["best"].best == 0.25
    assert fresh["seen"].target.best == 3.0


def test_saved_values_a_fresh_objects_state_dict_has_no_place_for_are_named_in_a_warning(
    tmp_path: Path, single_process_group: None
) -> None:
    tracker = GrowingTracker()
    tracker.history = {"0": 1.5, "1": 0.75}
    state, _ = _objects(tracker)
    fresh_state, fresh = _objects(GrowingTracker())
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("gpujobs_trainer")
    logger.addHandler(handler)
    try:
        _save_then_restore(tmp_path, state, fresh_state)
    finally:
        logger.removeHandler(handler)

    assert fresh["best"].history == {}
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert any("app.extras.best.epoch0, app.extras.best.epoch1" in w and "fixed key set" in w for w in warnings)
