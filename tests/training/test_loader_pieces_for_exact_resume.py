"""Stories of the pieces a resumable data pipeline is built from, one process each: per-sample
seeded augmentation, loader workers that survive torchrun's SIGTERM, and the named extra state
given to ``init(state=...)``."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from gpujobs_trainer import ConfigError, SeededSamples, per_rank
from gpujobs_trainer.extra_state import ExtraState

pytestmark = pytest.mark.training

REPO = Path(__file__).resolve().parents[2]


class Augmented(Dataset[tuple[float, float, float]]):
    """A sample is three draws: one from each global RNG an augmentation may use."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[float, float, float]:
        return float(torch.rand(1)), random.random(), float(np.random.uniform())


def test_a_sample_is_augmented_the_same_whatever_was_loaded_before_it() -> None:
    data = SeededSamples(Augmented(), seed=3)
    data.set_epoch(1)
    in_order = [data[i] for i in range(16)]
    shuffled = {i: data[i] for i in reversed(range(16))}
    assert in_order == [shuffled[i] for i in range(16)]
    assert len(set(in_order)) == 16  # every sample its own draws
    assert all(len(set(draws)) == 3 for draws in in_order)  # and each RNG its own stream


def test_each_epoch_augments_a_sample_differently_and_the_callers_rngs_are_left_alone() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    expected = (float(torch.rand(1)), random.random(), float(np.random.uniform()))
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)

    data = SeededSamples(Augmented(), seed=3)
    first = data[5]
    data.set_epoch(2)
    assert data[5] != first

    assert (float(torch.rand(1)), random.random(), float(np.random.uniform())) == expected


def test_workers_see_the_epoch_set_after_they_started() -> None:
    data = SeededSamples(Augmented(), seed=3)
    loader = DataLoader(data, batch_size=None, num_workers=1, persistent_workers=True)
    data.set_epoch(0)
    epoch0 = list(loader)
    data.set_epoch(1)
    epoch1 = list(loader)
    data.set_epoch(1)
    assert [tuple(sample) for sample in epoch1] == [data[i] for i in range(16)]
    assert epoch0 != epoch1


_STOPPED_BY_TORCHRUN = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    import torch
    from torch.utils.data import DataLoader
    import gpujobs_trainer

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # the trainer's flag handler
    loader = DataLoader(list(range(1000)), batch_size=1, num_workers=2)
    if sys.argv[1] != "plain":
        gpujobs_trainer.shield_workers(loader)
    if sys.argv[1] == "while starting":
        # the signal arrives in each worker after torch installed its own SIGTERM handler (which
        # kills a worker signalled by anyone but the rank) and before the worker_init_fn ran
        from torch.utils.data._utils import signal_handling
        installed = signal_handling._set_worker_signal_handlers
        def install_then_get_signalled(*args):
            installed(*args)
            os.killpg(os.getpgrp(), signal.SIGTERM)
        signal_handling._set_worker_signal_handlers = install_then_get_signalled
    batches = iter(loader)
    next(batches)
    # what torchrun does to a rank: signal its whole group, from another process
    subprocess.run([sys.executable, "-c", f"import os, signal; os.killpg({os.getpgrp()}, signal.SIGTERM)"])
    while not stop:
        time.sleep(0.01)
    time.sleep(0.5)  # the workers had time to die
    print("next batch", int(next(batches)), flush=True)
    # exits with the iterator still open: the workers must end with the process
    """
)


def _stopped_by_torchrun(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _STOPPED_BY_TORCHRUN, mode],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        cwd=REPO,
        check=False,
    )


def test_shielded_loader_workers_survive_a_sigterm_to_the_group_and_end_with_the_rank() -> None:
    result = _stopped_by_torchrun("shielded")
    assert result.returncode == 0, result.stderr
    assert "next batch 1" in result.stdout


def test_shielded_loader_workers_signalled_while_they_start_survive_too() -> None:
    """torchrun's signal can come while a loader starts its workers (every epoch, unless they
    persist): each worker is born with SIGTERM blocked, so it is held until the shield takes it."""
    result = _stopped_by_torchrun("while starting")
    assert result.returncode == 0, result.stderr
    assert "next batch 1" in result.stdout


def test_unshielded_loader_workers_die_of_that_sigterm_and_take_the_loop_down() -> None:
    result = _stopped_by_torchrun("plain")
    assert result.returncode != 0
    assert "DataLoader worker" in result.stderr


class Counter:
    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


def test_extra_state_that_cannot_be_checkpointed_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="'ema' is a dict, which has no state_dict"):
        ExtraState({"ema": {"decay": 0.99}}, rank=0)
    with pytest.raises(ConfigError, match="use torchdata's StatefulDataLoader"):
        ExtraState({"loader": DataLoader(list(range(4)))}, rank=0)
    with pytest.raises(ConfigError, match=r"'a\.b' is not a usable name"):
        ExtraState({"a.b": Counter()}, rank=0)


def test_loaders_and_marked_objects_are_per_rank_and_come_back_to_their_own_rank() -> None:
    loader = StatefulDataLoader(list(range(8)), batch_size=2)
    saved = ExtraState({"best": Counter(5), "seen": per_rank(Counter(7)), "loader": loader}, rank=1)
    assert set(saved.shared) == {"best"}
    assert set(saved.per_rank) == {"seen", "loader"}
    batches = iter(loader)
    next(batches)
    state = saved.per_rank_state()
    assert set(state) == {"rank00001"}

    fresh_seen, fresh_loader = Counter(), StatefulDataLoader(list(range(8)), batch_size=2)
    restored = ExtraState({"best": Counter(), "seen": per_rank(fresh_seen), "loader": fresh_loader}, rank=1)
    assert restored.per_rank_template() == {"rank00001": {"seen": b"", "loader": b""}}
    restored.load_per_rank(state)
    assert fresh_seen.value == 7
    assert [b.tolist() for b in fresh_loader] == [[2, 3], [4, 5], [6, 7]]
