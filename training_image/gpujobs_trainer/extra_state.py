"""Training state beyond model, optimizer and scheduler: ``init(..., state={...})``.

Any object with ``state_dict()``/``load_state_dict()`` (torch's ``Stateful``: a GradScaler, an
EMA module, a best-metric tracker, a StatefulDataLoader) can be given by name. Two kinds, because
DCP keeps one copy of every key that all ranks save (training-round2.md §2.2):

- **Shared** state is the same on every rank (a GradScaler after all-reduced gradients, an EMA of
  synchronised weights, a tracker of an all-reduced metric). It is saved through DCP as it is
  (tensors as tensors, so an EMA is written once and resharded like the model) and every rank
  loads the one saved copy. Its ``state_dict()`` must have the same keys before training as after:
  DCP fills in the keys of a fresh object's ``state_dict()`` and ignores the rest.
- **Per-rank** state differs by rank (a data loader's position, a per-rank counter): each rank
  saves its own under a key of its own and gets exactly that back, never another rank's. Mark
  such objects with `per_rank`; data loaders are per-rank without being marked. Each object is
  stored as one opaque value (``torch.save`` bytes, read back with the weights-only unpickler), so
  its ``state_dict()`` may change shape as it runs, as a loader's does. After a change of world
  size there is no state for the new ranks: per-rank state is then not restored (logged). A loader
  Hugging Face Accelerate prepared is handled underneath, and must be stateful and seedable
  (`prepared_loaders`).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader

from gpujobs_trainer.data import prepare_loader
from gpujobs_trainer.errors import CheckpointError, ConfigError
from gpujobs_trainer.prepared_loaders import check_prepared_loader

log = logging.getLogger("gpujobs_trainer")


@runtime_checkable
class StatefulObject(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class PerRank:
    """Marks an entry of ``init(state=...)`` as differing by rank: see `per_rank`."""

    target: StatefulObject


def per_rank(target: StatefulObject) -> PerRank:
    """Save ``target`` on every rank under that rank's own key and restore it to the same rank."""
    return PerRank(target)


def rank_key(rank: int) -> str:
    return f"rank{rank:05d}"


class ExtraState:
    """The named objects of ``init(state=...)``, split into shared and per-rank ones."""

    def __init__(self, objects: Mapping[str, Any], *, rank: int) -> None:
        self.rank = rank
        self.shared: dict[str, StatefulObject] = {}
        self.per_rank: dict[str, StatefulObject] = {}
        for name, value in objects.items():
            target = value.target if isinstance(value, PerRank) else value
            _check(name, target)
            if isinstance(target, DataLoader):
                check_prepared_loader(name, target)
                prepare_loader(target, rank=rank)
            if isinstance(value, PerRank) or isinstance(target, DataLoader):
                self.per_rank[name] = target
            else:
                self.shared[name] = target

    def __bool__(self) -> bool:
        return bool(self.shared or self.per_rank)

    def shared_state(self) -> dict[str, Any]:
        """What every rank saves (and DCP deduplicates); also the template to load it into."""
        return {name: target.state_dict() for name, target in self.shared.items()}

    def per_rank_state(self) -> dict[str, Any]:
        """This rank's own values, under its own key."""
        return {rank_key(self.rank): {name: _to_bytes(target.state_dict()) for name, target in self.per_rank.items()}}

    def per_rank_template(self) -> dict[str, Any]:
        """Where this rank's values load to (building it never asks a loader for its state,
        which would start its workers)."""
        return {rank_key(self.rank): dict.fromkeys(self.per_rank, b"")}

    def load_shared(self, state: Mapping[str, Any]) -> None:
        for name, target in self.shared.items():
            target.load_state_dict(dict(state[name]))

    def load_per_rank(self, state: Mapping[str, Any]) -> None:
        mine = state[rank_key(self.rank)]
        for name, target in self.per_rank.items():
            target.load_state_dict(_from_bytes(name, mine[name]))


def _check(name: str, target: Any) -> None:
    if not isinstance(name, str) or not name or "." in name:
        raise ConfigError(f"init(state=...): {name!r} is not a usable name (a non-empty string without dots)")
    if not isinstance(target, StatefulObject):
        hint = (
            " (use torchdata's StatefulDataLoader, a drop-in DataLoader that has)"
            if isinstance(target, DataLoader)
            else ""
        )
        raise ConfigError(
            f"init(state=...): {name!r} is a {type(target).__name__}, which has no state_dict()/load_state_dict()"
            + hint
        )


def _to_bytes(state: Mapping[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return buffer.getvalue()


def _from_bytes(name: str, data: Any) -> dict[str, Any]:
    try:
        loaded = torch.load(io.BytesIO(bytes(data)), weights_only=True)
    except Exception as exc:  # a torch.load failure names no checkpoint: say which state it was
        raise CheckpointError(f"per-rank state {name!r} cannot be loaded safely: {exc}") from exc
    if not isinstance(loaded, dict):
        raise CheckpointError(f"per-rank state {name!r} is a {type(loaded).__name__}, not a state dict")
    return loaded
