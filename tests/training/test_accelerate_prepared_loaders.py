"""A loader Hugging Face Accelerate prepared, given to ``init(state=...)``: handled underneath, or
refused at init naming the one line that fixes it (`gpujobs_trainer.prepared_loaders`).

The 2-process story, an Accelerate loop over a prepared loader with workers stopped by SIGTERM and
resumed bit for bit, is the ``accelerate_loader`` recipe in test_framework_recipes.py.
"""

from __future__ import annotations

import gc
import multiprocessing
import signal
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader, TensorDataset

from gpujobs_trainer import ConfigError
from gpujobs_trainer.extra_state import ExtraState
from gpujobs_trainer.prepared_loaders import underlying_loader

pytestmark = [pytest.mark.training, pytest.mark.timeout(120)]


def _prepared(*, shuffle: bool = True, stateful: bool = True, seedable: bool = True, workers: int = 0) -> object:
    accelerator = Accelerator(
        cpu=True,
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful, use_seedable_sampler=seedable),
    )
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4, shuffle=shuffle, num_workers=workers)
    return accelerator.prepare(loader)


def _blocked_or_ignored(pid: int, signum: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    bit = 1 << (signum - 1)
    return bool(int(fields["SigBlk"], 16) & bit or int(fields["SigIgn"], 16) & bit)


def test_a_prepared_plain_dataloader_is_refused_because_it_has_no_position_to_save() -> None:
    with pytest.raises(ConfigError, match=r"'loader' was prepared by Accelerate around a plain DataLoader") as raised:
        ExtraState({"loader": _prepared(stateful=False)}, rank=0)

    assert "use_stateful_dataloader=True, use_seedable_sampler=True" in str(raised.value)


def test_a_prepared_loader_shuffling_with_accelerates_default_sampler_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"'loader' shuffles with Accelerate's default RandomSampler"):
        ExtraState({"loader": _prepared(seedable=False)}, rank=0)


def test_a_prepared_loader_that_does_not_shuffle_needs_no_seedable_sampler() -> None:
    extras = ExtraState({"loader": _prepared(shuffle=False, seedable=False)}, rank=0)

    assert list(extras.per_rank) == ["loader"]


def test_the_workers_of_a_prepared_loader_are_shielded_from_sigterm_and_seeded_apart_from_training() -> None:
    loader = _prepared(workers=2)
    inner = underlying_loader(loader)
    assert inner is not loader  # Accelerate's adapter, whose attribute writes would miss the workers

    ExtraState({"loader": loader}, rank=0)
    try:
        next(iter(loader))  # type: ignore[call-overload]
        workers = multiprocessing.active_children()

        assert len(workers) == 2
        assert all(_blocked_or_ignored(worker.pid, signal.SIGTERM) for worker in workers if worker.pid)
        assert inner.generator is not None  # worker seeds no longer drawn from the training RNG
    finally:
        inner.load_state_dict({})  # drops the iterator: its workers end with it
        gc.collect()
