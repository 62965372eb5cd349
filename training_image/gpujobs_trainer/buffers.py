"""Module buffers (BatchNorm running statistics) are saved as rank 0 holds them.

Under DDP every rank updates its buffers locally during forward and DDP copies rank 0's over the
others at the start of the next forward: rank 0's are the ones training goes on with. At a step
boundary, where checkpoints are taken, the replicas differ, and DCP writes one copy per key from
whichever rank its planner picks (a mix of ranks, key by key: training-round2.md §3). A run resumed
from that copy is not the run that would have continued. So the saved values are rank 0's: each
buffer is broadcast from rank 0 into a copy that replaces it in the state being saved. The
module's own buffers are left alone (the next forward does that copy under DDP; under FSDP2, which
never synchronises buffers, training is not changed by a save), and every rank resumes with rank
0's statistics.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpujobs_trainer.state_io import is_plain_tensor


def take_buffers_from_rank0(model: nn.Module, model_state: MutableMapping[str, Any], *, group: Any) -> None:
    """Replace every buffer in ``model_state`` (a state dict of ``model``) by rank 0's values.

    A collective on ``group`` (gloo: the values travel through host memory): every rank calls it
    with the same model. One broadcast per dtype, whatever the number of buffers."""
    if dist.get_world_size(group) < 2:
        return
    storages = {b.untyped_storage().data_ptr() for b in model.buffers() if is_plain_tensor(b) and b.numel() > 0}
    by_dtype: dict[torch.dtype, list[str]] = {}
    for key, value in model_state.items():
        if is_plain_tensor(value) and value.numel() > 0 and value.untyped_storage().data_ptr() in storages:
            by_dtype.setdefault(value.dtype, []).append(key)
    for dtype in sorted(by_dtype, key=str):  # the same order on every rank
        keys = by_dtype[dtype]
        flat = torch.cat([model_state[key].detach().reshape(-1).to("cpu") for key in keys])
        dist.broadcast(flat, src=dist.get_global_rank(group, 0), group=group)
        for key, piece in zip(keys, torch.split(flat, [model_state[key].numel() for key in keys]), strict=True):
            model_state[key] = piece.reshape(model_state[key].shape)
