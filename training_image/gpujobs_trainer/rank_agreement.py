"""Shared state that differs across ranks is refused at save time, never silently collapsed.

A shared ``init(state=...)`` entry is saved once for all ranks: DCP keeps one copy of each key,
from whichever rank its planner picks, and every rank resumes with that copy (`extra_state`). That
is right only if the ranks hold the same values. The usual object that does not is an EMA of the
model with its buffers (``AveragedModel(model, use_buffers=True)``): each rank averages its own
BatchNorm statistics, which DDP never synchronises between forwards. Saved as shared state, every
rank but one would resume with another rank's EMA, and nothing would say so.

So every save first compares the shared state across ranks: each rank reduces every tensor to a
fingerprint on its own device (its sum, the sums of its absolute values, of its squares and of
its values weighted by position, so a reordering counts too; in float64: four numbers whatever the
size, so the check costs a pass over the state and no copy of it to the host) and every other value to its ``repr``; the fingerprints are gathered (one small
collective on the checkpoint group) and any difference is a `ConfigError` that names the entry and
the key, and says to wrap the entry in ``per_rank()``. Every rank gathers every fingerprint, so all
ranks raise together and none is left waiting in a collective. Sharded tensors (DTensor) differ
by design and are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from gpujobs_trainer.errors import ConfigError
from gpujobs_trainer.state_io import is_plain_tensor

Fingerprint = dict[str, Any]


def fingerprint(state: Mapping[str, Any]) -> Fingerprint:
    """One value per leaf of ``state`` (flattened keys ``name.key.subkey``) that differs when it does."""
    found: Fingerprint = {}
    _walk(state, "", found)
    return found


def _walk(value: Any, key: str, found: Fingerprint) -> None:
    if isinstance(value, Mapping):
        for sub, item in value.items():
            _walk(item, f"{key}.{sub}" if key else str(sub), found)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _walk(item, f"{key}.{index}", found)
    elif isinstance(value, torch.Tensor):
        if not is_plain_tensor(value):
            return  # a DTensor's local shard differs by rank on purpose
        if value.numel() == 0:
            found[key] = (tuple(value.shape), str(value.dtype))
            return
        flat = value.detach().reshape(-1).to(torch.float64)
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device)
        sums = torch.stack([flat.sum(), flat.abs().sum(), (flat * flat).sum(), (flat * weights).sum()])
        found[key] = (tuple(value.shape), str(value.dtype), tuple(sums.tolist()))
    else:
        found[key] = repr(value)


def first_difference(fingerprints: list[Fingerprint]) -> tuple[int, str] | None:
    """The first (rank, key) whose fingerprint differs from rank 0's, if any."""
    reference = fingerprints[0]
    for rank, other in enumerate(fingerprints[1:], start=1):
        for key in sorted(reference.keys() | other.keys()):
            if reference.get(key) != other.get(key):
                return rank, key
    return None


def check_shared_state_agrees(shared: Mapping[str, Any], *, group: Any) -> None:
    """Collective on ``group``: ConfigError on every rank when any rank's shared state differs from rank 0's."""
    world = dist.get_world_size(group)
    if world < 2:
        return
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, fingerprint(shared), group=group)
    difference = first_difference(gathered)
    if difference is None:
        return
    rank, key = difference
    name = key.split(".", 1)[0]
    raise ConfigError(
        f"init(state=...): {name!r} differs across ranks (rank {rank}'s {key} is not rank 0's), so saving it "
        f"once for all ranks would silently give every rank one rank's copy. If each rank keeps its own "
        f"(an EMA with use_buffers=True averages each rank's own BatchNorm statistics), wrap it in "
        f"per_rank(): state={{{name!r}: gpujobs_trainer.per_rank(...)}}; if it should be the same on every "
        f"rank, keep it in sync (update it from all-reduced values)"
    )
