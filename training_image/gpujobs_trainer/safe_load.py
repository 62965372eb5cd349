"""Loading a checkpoint without running code from it.

DCP trusts its files: ``FileSystemReader.read_metadata`` is a plain ``pickle.load`` of
``.metadata``, ``DefaultLoadPlanner.load_bytes`` a ``torch.load(weights_only=False)`` of every
non-tensor value, and the shard paths in the metadata are joined to the folder as they are. A
checkpoint planted in a job's prefix could therefore run code in the trainer that resumes from it,
or make it read files outside the step folder. Digests in the commit marker do not prevent that
(whoever can write the folder can write the marker too), so the loaders themselves are safe:

- `load_metadata` unpickles ``.metadata`` with an allowlist of exactly the classes DCP's
  ``Metadata`` is made of in torch 2.13 (``torch/distributed/checkpoint/metadata.py``, its
  ``_StorageInfo``, ``torch.Size``, dtypes and layouts), refuses ``BUILD`` on anything but an
  instance of those classes (a ``BUILD`` on a class object would set attributes of the class
  itself, for every later use in this process), then checks the result's shape: every shard path
  is a plain ``__<rank>_<n>.distcp`` name, and no stream transforms (decompressors) are asked for.
  torch's own safe loader (``torch.load(weights_only=True)``) cannot read it: it is not a
  torch.save archive and uses pickle protocol 4, which the weights-only unpickler rejects.
- `SafeReader` is DCP's FileSystemReader reading metadata that way (and never a rank-local
  ``__<rank>.metadata``, which we do not write).
- `SafeLoadPlanner` is DCP's default planner with non-tensor values loaded by torch's weights-only
  unpickler (plain Python values, as optimizer hyper-parameters and LR scheduler states are; a
  script with other types allowlists them with ``torch.serialization.add_safe_globals``).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Collection
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import torch
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from gpujobs_trainer.errors import CheckpointError
from gpujobs_trainer.layout import DCP_METADATA_FILE, is_shard_file

_DCP_CLASSES: tuple[type, ...] = (
    dcp_metadata.Metadata,
    dcp_metadata.MetadataIndex,
    dcp_metadata.TensorStorageMetadata,
    dcp_metadata.BytesStorageMetadata,
    dcp_metadata.ChunkStorageMetadata,
    dcp_metadata.TensorProperties,
    dcp_metadata.StorageMeta,
    _StorageInfo,
)


def _path_string(*parts: str) -> str:
    """What ``StorageMeta.checkpoint_id`` (a PosixPath when saved) becomes: only its text."""
    return str(PurePosixPath(*parts))


def _allowed_globals() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {(cls.__module__, cls.__name__): cls for cls in _DCP_CLASSES}
    encoding = dcp_metadata._MEM_FORMAT_ENCODING
    allowed[(encoding.__module__, encoding.__name__)] = encoding
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    allowed[("pathlib", "PosixPath")] = _path_string
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            allowed[("torch", name)] = value
    return allowed


_ALLOWED = _allowed_globals()
_BUILD = pickle._Unpickler.dispatch[pickle.BUILD[0]]


class _MetadataUnpickler(pickle._Unpickler):
    """The pure-Python unpickler (its dispatch table can be narrowed, the C one's cannot), with an
    allowlist of globals and BUILD only on instances of DCP's metadata classes."""

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata") from None

    def _build(self) -> None:
        stack: list[Any] = self.stack  # type: ignore[attr-defined]  # pickle._Unpickler's own stack
        target = stack[-2] if len(stack) >= 2 else None
        if type(target) not in _DCP_CLASSES:
            raise pickle.UnpicklingError(f"refusing to set the state of {type(target).__name__}")
        _BUILD(self)  # type: ignore[arg-type]  # typeshed types the table with the C Unpickler

    dispatch[pickle.BUILD[0]] = _build


def load_metadata(path: Path, *, shard_files: Collection[str] | None = None) -> dcp_metadata.Metadata:
    """DCP's metadata at ``path``, loaded without running code from it; with ``shard_files``,
    every shard it points into must be one of them. Raises CheckpointError otherwise."""
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except Exception as exc:  # whatever a crafted file makes the unpickler raise, it is refused
        raise CheckpointError(f"{path.name} is not DCP metadata we can load safely: {exc}") from exc
    problem = _shape_problem(metadata, shard_files)
    if problem:
        raise CheckpointError(f"{path.name} is not DCP metadata we can load safely: {problem}")
    loaded: dcp_metadata.Metadata = metadata
    return loaded


def _shape_problem(metadata: Any, shard_files: Collection[str] | None) -> str:
    if type(metadata) is not dcp_metadata.Metadata:
        return f"it holds a {type(metadata).__name__}, not Metadata"
    if not isinstance(metadata.state_dict_metadata, dict) or not isinstance(metadata.storage_data, dict):
        return "its tables are not dictionaries"
    if metadata.storage_meta is not None and type(metadata.storage_meta) is not dcp_metadata.StorageMeta:
        return "its storage_meta is not a StorageMeta"
    for index, info in metadata.storage_data.items():
        if type(index) is not dcp_metadata.MetadataIndex or type(info) is not _StorageInfo:
            return "its storage table holds something other than DCP storage entries"
        if not isinstance(info.relative_path, str) or not is_shard_file(info.relative_path):
            return f"{index.fqn!r} points at {info.relative_path!r}, which is not a shard of this folder"
        if shard_files is not None and info.relative_path not in shard_files:
            return f"{index.fqn!r} points at {info.relative_path}, which the commit marker does not list"
        if not (type(info.offset) is int and type(info.length) is int and info.offset >= 0 and info.length >= 0):
            return f"{index.fqn!r} has a bad offset or length"
        if info.transform_descriptors:
            return f"{index.fqn!r} asks for stream transforms {info.transform_descriptors!r}"
    return ""


class SafeReader(FileSystemReader):
    """DCP's FileSystemReader, with metadata loaded by `load_metadata`."""

    def read_metadata(self, *_: Any, **__: Any) -> dcp_metadata.Metadata:
        # No parameter named "kwargs": DCP then never falls back to rank-local metadata files.
        metadata = load_metadata(Path(self.path) / DCP_METADATA_FILE)
        if metadata.storage_meta is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading non-tensor values with torch's weights-only unpickler.

    ``unloaded`` lists the checkpoint's keys that the state loaded into has no place for (DCP
    skips them without a word)."""

    unloaded: tuple[str, ...] = ()

    def set_up_planner(
        self, state_dict: dict[str, Any], metadata: dcp_metadata.Metadata | None = None, is_coordinator: bool = False
    ) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if metadata is not None:
            self.unloaded = tuple(sorted(set(metadata.state_dict_metadata) - set(self.state_dict)))

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(f"{read_item.dest_index.fqn} holds more than plain values: {exc}") from exc
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
