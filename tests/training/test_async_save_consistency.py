"""An asynchronous checkpoint holds the state of the step it was taken at, even though the copy of
parameters and optimizer state runs in the background while training goes on (docs/training.md:
between ``save()`` and the next ``optimizer.step()`` only ``optimizer.step()`` may change them).

Single process, gloo over a FileStore: no torchrun, no network port.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.staging import DefaultStager
from torch.distributed.checkpoint.state_dict import get_state_dict

from gpujobs_trainer.checkpoint import CheckpointManager, TrainingState
from gpujobs_trainer.distributed import DistEnv
from gpujobs_trainer.storage import LocalStore

ENV = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
STAGING_DELAY_S = 0.3  # long enough that the next step would overtake an unguarded copy


@pytest.fixture
def single_process_group(tmp_path: Path) -> Iterator[None]:
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "pg-store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def slow_staging(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Delay torch's background staging copy so that training reliably reaches the next
    ``optimizer.step()`` before the copy is done: the window the step pre-hook must close."""
    started: list[float] = []
    original = DefaultStager._stage

    def delayed(self: DefaultStager, state_dict: Any, **kwargs: Any) -> Any:
        started.append(time.monotonic())
        time.sleep(STAGING_DELAY_S)
        return original(self, state_dict, **kwargs)

    monkeypatch.setattr(DefaultStager, "_stage", delayed)
    return started


def _training_objects(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    return model, optimizer, scheduler


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, step: int) -> None:
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(8, 16, generator=generator) * (step + 1)  # shifts BatchNorm statistics
    targets = torch.randint(0, 4, (8,), generator=generator)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(inputs), targets).backward()  # updates BatchNorm buffers
    optimizer.step()
    scheduler.step()


def _snapshot(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return _clone({"model": model_sd, "optim": optim_sd, "scheduler": scheduler.state_dict()})


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {key: _clone(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_clone(value) for value in obj)
    return obj


def _differences(actual: Any, expected: Any, path: str = "") -> list[str]:
    """Every leaf where the two nested states differ (tensors compared with torch.equal)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or not torch.equal(actual, expected):
            return [path]
        return []
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return [f"{path} (keys)"]
        return [d for key in expected for d in _differences(actual[key], expected[key], f"{path}/{key}")]
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            return [f"{path} (length)"]
        return [
            d for i, (a, e) in enumerate(zip(actual, expected, strict=True)) for d in _differences(a, e, f"{path}[{i}]")
        ]
    return [] if actual == expected else [f"{path}: {actual!r} != {expected!r}"]


@pytest.mark.training
@pytest.mark.timeout(120)
def test_an_async_checkpoint_holds_the_state_of_the_step_it_was_taken_at(
    tmp_path: Path, single_process_group: None, slow_staging: list[float]
) -> None:
    store = LocalStore(tmp_path / "checkpoints")
    model, optimizer, scheduler = _training_objects(seed=0)
    manager = CheckpointManager(store=store, env=ENV, state=TrainingState(model, optimizer, scheduler))
    try:
        for step in range(3):
            _train_step(model, optimizer, scheduler, step)
        expected = _snapshot(model, optimizer, scheduler)

        pending = manager.save(step=3, reason="periodic", position={"epoch": 0, "offset": 3}, blocking=False)
        for step in range(3, 5):  # training goes on at once, while the copy runs in the background
            _train_step(model, optimizer, scheduler, step)
        later = _snapshot(model, optimizer, scheduler)
        result = pending.result(timeout=60)
        assert result.committed
        assert result.step == 3
    finally:
        manager.close()
    assert slow_staging, "the save was expected to stage in the background"

    for part in ("model", "optim", "scheduler"):  # the later steps did change every part
        assert _differences(later[part], expected[part]), part
    assert {"running_mean", "running_var", "num_batches_tracked"} <= {k.rsplit(".", 1)[-1] for k in expected["model"]}
    moments = next(iter(expected["optim"]["state"].values()))
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(moments)

    fresh_model, fresh_optimizer, fresh_scheduler = _training_objects(seed=1)
    restorer = CheckpointManager(
        store=store, env=ENV, state=TrainingState(fresh_model, fresh_optimizer, fresh_scheduler)
    )
    try:
        marker = restorer.restore()
    finally:
        restorer.close()
    assert marker is not None
    assert marker.step == 3
    assert _differences(_snapshot(fresh_model, fresh_optimizer, fresh_scheduler), expected) == []
