"""What a checkpoint holds and how its shards are written: the pieces of a save below the manager.

- `TrainingState` is the one DCP `Stateful` of a run: model and optimizer through
  ``get_state_dict``/``set_state_dict`` (an in-place ``dcp.load`` into a fresh optimizer's
  ``state_dict()`` silently drops Adam's moments), the LR scheduler, and the script's own state
  (``init(state=...)``, `extra_state`): shared under ``extras``, this rank's under ``per_rank``.
  Those two keys are there only when the script gives such state, so checkpoints of runs without
  it keep their layout.
- `ShardWriter` is DCP's FileSystemWriter with torch.save's per-record CRC32 switched off while it
  writes (torch.load never checks it; it cost ~0.7 s per GB on one core) and a digest of every
  file it writes computed on the way to disk, for the commit marker: one pass over the bytes (no
  second read), in each writer thread (BLAKE3 and hashlib release the GIL, so they hash in
  parallel). BLAKE3 by default (`digests`); ``digest="sha256"`` is what the benchmark compares.
- `optimizer_owned` and `snapshot_mutables` decide what an asynchronous save may copy in the
  background (tensors only ``optimizer.step()`` changes) and what it must copy before returning.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future as TorchFuture

from gpujobs_trainer.digests import DEFAULT_ALGORITHM, new_hasher

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from gpujobs_trainer.extra_state import ExtraState


EXTRAS_KEY = "extras"  # the script's shared state in TrainingState's dict (app.extras.<name>...)
PER_RANK_KEY = "per_rank"  # each rank's own (app.per_rank.rank<NNNNN>.<name>)


class TrainingState(Stateful):
    """Model, optimizer, LR scheduler and the script's extra state as one DCP Stateful
    (FQN-normalised by get_state_dict)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None,
        extras: ExtraState | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.extras = extras

    def state_dict(self) -> dict[str, Any]:
        """What a save writes."""
        state = self._common()
        if self.extras is not None and self.extras.per_rank:
            state[PER_RANK_KEY] = self.extras.per_rank_state()
        return state

    def load_template(self, *, per_rank: bool) -> dict[str, Any]:
        """What a restore loads into, then hands to `load_state_dict`; without this rank's own
        state when ``per_rank`` is False (the checkpoint has none for it)."""
        state = self._common()
        if per_rank and self.extras is not None and self.extras.per_rank:
            state[PER_RANK_KEY] = self.extras.per_rank_template()
        return state

    def _common(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.extras is not None and self.extras.shared:
            state[EXTRAS_KEY] = self.extras.shared_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])
        if self.extras is not None:
            if EXTRAS_KEY in state_dict:
                self.extras.load_shared(state_dict[EXTRAS_KEY])
            if PER_RANK_KEY in state_dict:
                self.extras.load_per_rank(state_dict[PER_RANK_KEY])


# Several writer threads per rank (one file each) so that serialising one shard overlaps with
# writing and fsyncing another; more threads than cores only add contention.
WRITER_THREADS = max(1, min(4, os.cpu_count() or 1))


class _Crc32Off:
    """Turn torch.save's CRC32 off while at least one checkpoint write is running.

    The switch is process-wide in torch: a user's own torch.save during a checkpoint write also
    gets no CRC32, which torch.load ignores anyway (it never verifies it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved = True

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._saved = torch.serialization.get_crc32_options()
                torch.serialization.set_crc32_options(False)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    torch.serialization.set_crc32_options(self._saved)


_crc32_off = _Crc32Off()


class _DigestingStream(io.RawIOBase):
    """A file being written that hashes every byte on its way through."""

    def __init__(self, raw: Any, algorithm: str) -> None:
        super().__init__()
        self._raw = raw
        self.hasher = new_hasher(algorithm)

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        written: int = self._raw.write(data)
        self.hasher.update(memoryview(data))
        return written

    def tell(self) -> int:
        position: int = self._raw.tell()
        return position

    def fileno(self) -> int:
        number: int = self._raw.fileno()
        return number

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        super().close()  # flushes first
        self._raw.close()


class _DigestingFileSystem(FileSystem):
    """DCP's local file system that records the digest of every file written through it, by
    name (a rename, as DCP does with ``.metadata.tmp``, carries the digest along)."""

    def __init__(self, algorithm: str) -> None:
        super().__init__()
        self.algorithm = algorithm
        self.digests: dict[str, str] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        with super().create_stream(path, mode) as raw:
            if "w" not in mode:
                yield raw
                return
            stream = _DigestingStream(raw, self.algorithm)
            yield stream
        with self._lock:
            self.digests[Path(path).name] = stream.hasher.hexdigest()

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            digest = self.digests.pop(Path(path).name, None)
            if digest is not None:
                self.digests[Path(new_path).name] = digest


class ShardWriter(FileSystemWriter):
    """DCP's FileSystemWriter (one file per writer thread, one fsync per file) without CRC32, that
    knows the digest of every file it wrote (``digests``, by file name)."""

    def __init__(self, path: str, *, thread_count: int, digest: str = DEFAULT_ALGORITHM) -> None:
        super().__init__(path, thread_count=thread_count)
        self._files = _DigestingFileSystem(digest)
        self.fs = self._files

    @property
    def digest_algorithm(self) -> str:
        return self._files.algorithm

    @property
    def digests(self) -> dict[str, str]:
        """File name -> digest of each file written so far; the caller may add files it wrote."""
        return self._files.digests

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> TorchFuture[list[WriteResult]]:
        with _crc32_off():
            return super().write_data(plan, planner)  # synchronous: the future is already done


def optimizer_owned(optimizer: torch.optim.Optimizer) -> set[int]:
    """Storages that only ``optimizer.step()`` changes: parameters and optimizer state."""
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    tensors += [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    return {t.untyped_storage().data_ptr() for t in tensors if is_plain_tensor(t) and t.numel() > 0}


def is_plain_tensor(tensor: Any) -> bool:
    """A dense tensor or parameter (not a DTensor or other subclass with its own storage rules)."""
    return type(tensor) in (torch.Tensor, nn.Parameter) and tensor.layout == torch.strided


def snapshot_mutables(obj: Any, owned: set[int]) -> Any:
    """A copy of a state dict that still shares tensors in ``owned`` storages (copied later, in the
    background, before the next optimizer step) and copies everything else now (module buffers that
    the next forward changes, scheduler and optimizer hyper-parameters)."""
    if isinstance(obj, torch.Tensor):
        if is_plain_tensor(obj) and obj.numel() > 0 and obj.untyped_storage().data_ptr() in owned:
            return obj
        return obj.detach().clone()
    if isinstance(obj, Mapping):
        return {key: snapshot_mutables(value, owned) for key, value in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(snapshot_mutables(value, owned) for value in obj)
    return copy.deepcopy(obj)
