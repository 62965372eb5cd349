"""Consolidated model weights, for use outside training: from the live job, or from a checkpoint.

- ``Run.export(model)`` (``export_model``): every rank gathers the full model state dict
  (``get_model_state_dict`` with ``full_state_dict`` and ``cpu_offload``: a collective, after which
  rank 0 alone holds full CPU tensors; DDP's ``module.`` and compile's ``_orig_mod.`` prefixes are
  gone), then rank 0 writes it. The same call works for DDP and FSDP2.
- ``python -m gpujobs_trainer.export SOURCE OUT``: the model weights of a committed DCP checkpoint
  (``SOURCE`` a checkpoint URI, s3:// or a path, for its newest committed step, or one step's
  folder), verified against its commit marker and loaded with the safe readers of ``safe_load``,
  without the optimizer and without building the model (only ``app.model`` is read).

Files are written under a name the bootstrap never uploads, then renamed, so an upload asked for
meanwhile never sends half a file. ``.safetensors`` files get safetensors (tensors that share memory,
such as tied weights, are written as copies: safetensors refuses shared storage); any other suffix
gets ``torch.save``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.layout import DCP_METADATA_FILE, parse_step_dir
from gpujobs_trainer.outputs import write_then_rename
from gpujobs_trainer.safe_load import SafeLoadPlanner, SafeReader, load_metadata
from gpujobs_trainer.storage import open_store

log = logging.getLogger("gpujobs_trainer")

MODEL_KEY = "app.model"
"""Where the model's state dict sits in our checkpoints (`CheckpointManager` saves ``{"app": state}``)."""


def export_model(model: nn.Module, path: Path, *, is_main: bool, metadata: Mapping[str, str]) -> Path | None:
    """Collective: rank 0 writes the full weights of ``model`` to ``path``; returns it there, None elsewhere."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if is_main:
        write_weights(full, path, metadata=metadata)
    if dist.is_initialized():
        dist.barrier()
    return path if is_main else None


def write_weights(state: Mapping[str, Any], path: Path, *, metadata: Mapping[str, str]) -> None:
    """``state``'s tensors to ``path`` (safetensors or torch.save by suffix), complete or not at all."""
    tensors = _unshared(state)
    partial = write_then_rename(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import save_file

            save_file(tensors, str(partial), metadata={"format": "pt", **metadata})
        else:
            torch.save(tensors, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    log.info("exported %d tensors to %s", len(tensors), path)


def _unshared(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, none sharing storage with another; non-tensor entries are left out."""
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            log.warning("export: %s is not a tensor (%s); left out", name, type(value).__name__)
            continue
        tensor = value.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if storage in storages and tensor.numel() else tensor
        storages.add(storage)
    return tensors


# ---- from a committed checkpoint ---------------------------------------------------------------
class _ModelOnlyPlanner(SafeLoadPlanner, _EmptyStateDictLoadPlanner):
    """Builds the state dict from the checkpoint's metadata (no model needed), reading only ``keys``,
    with non-tensor values through the weights-only unpickler."""


def load_checkpoint_weights(source: str, *, staging: Path) -> tuple[dict[str, torch.Tensor], int]:
    """The model weights of the checkpoint at ``source`` and its step; CheckpointError if unusable."""
    root, step = _split_step(source)
    store = open_store(root, local_dir=str(staging))
    if step is None:
        committed = store.listing().committed
        if not committed:
            raise CheckpointError(f"no committed checkpoint at {source}")
        step = committed[-1]
    marker = store.read_commit(step)
    folder = store.fetch(step, marker)
    load_metadata(folder / DCP_METADATA_FILE, shard_files=marker.files)
    loaded: dict[str, Any] = {}
    planner = _ModelOnlyPlanner(keys={MODEL_KEY})  # type: ignore[no-untyped-call]  # torch's __init__ is unannotated
    _load_state_dict(loaded, storage_reader=SafeReader(folder), planner=planner, no_dist=True)
    return dict(loaded["app"]["model"]), step


def _split_step(source: str) -> tuple[str, int | None]:
    """(checkpoint URI, step) for a step folder; (source, None) for a checkpoint URI."""
    head, _, last = source.rstrip("/").rpartition("/")
    step = parse_step_dir(last)
    return (head, step) if step is not None and head else (source, None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpujobs_trainer.export",
        description="Write the model weights of a committed gpujobs checkpoint as safetensors or torch.save.",
    )
    parser.add_argument("source", help="checkpoint URI (its newest committed step) or one step-NNNNNNNN folder")
    parser.add_argument("out", type=Path, help="file to write: .safetensors, or anything else for torch.save")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        with tempfile.TemporaryDirectory(prefix="gpujobs-export-") as staging:
            weights, step = load_checkpoint_weights(args.source, staging=Path(staging))
            write_weights(weights, args.out, metadata={"step": str(step), "source": args.source})
    except CheckpointError as exc:
        print(f"gpujobs_trainer.export: {exc}", file=sys.stderr)
        return 1
    print(f"step {step}: {len(weights)} tensors written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
