"""torch.distributed.checkpoint loads that run no code from the checkpoint.

DCP's ``FileSystemReader`` reads ``.metadata`` with plain ``pickle.load`` and its default planner
reads every non-tensor item with ``torch.load(weights_only=False)``: a sharded checkpoint on
shared storage could run code in every rank. Here ``.metadata`` goes through an unpickler that
builds only DCP's metadata classes (and the torch dtypes, layouts and sizes they hold), and
non-tensor items through ``weights_only=True``; anything else is refused with
``UnsafeCheckpointError`` naming the file.
"""

from __future__ import annotations

import collections
import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from primus_lib.train.checkpoint.safe_load import UnsafeCheckpointError, load_torch

METADATA = ".metadata"
_METADATA_CLASSES = (
    "Metadata",
    "MetadataIndex",
    "StorageMeta",
    "ChunkStorageMetadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "TensorProperties",
    "_MEM_FORMAT_ENCODING",
)
ALLOWED: dict[tuple[str, str], Any] = {
    **{(dcp_metadata.__name__, n): getattr(dcp_metadata, n) for n in _METADATA_CLASSES},
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # a name -> torch.layout lookup
    ("pathlib", "PosixPath"): Path,  # StorageMeta.checkpoint_id: the writer's path
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, shown: object) -> None:
        super().__init__(io.BytesIO(data))
        self.shown = shown

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return ALLOWED[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"{self.shown}: refused to unpickle {module}.{name}: DCP metadata holds only "
            "torch.distributed.checkpoint's metadata classes; check who can write this storage, and remove it"
        )


def read_metadata(path: Path, shown: object | None = None) -> dcp_metadata.Metadata:
    """A ``.metadata`` file, through the allow-list (``UnsafeCheckpointError`` for anything else)."""
    shown = shown if shown is not None else path
    try:
        metadata = _MetadataUnpickler(Path(path).read_bytes(), shown).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as exc:
        raise UnsafeCheckpointError(f"{shown}: not DCP metadata: {type(exc).__name__}: {exc}") from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise UnsafeCheckpointError(f"{shown}: not DCP metadata: a pickled {type(metadata).__name__}")
    return metadata


class SafeReader(FileSystemReader):
    """``FileSystemReader`` whose metadata comes through ``read_metadata``; ``shown`` names the
    checkpoint in errors (the S3/HDFS directory a local staging copy came from)."""

    def __init__(self, path: Path, shown: str | None = None) -> None:
        super().__init__(path)
        self.shown = shown

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        rank = kwargs.get("rank")
        name = METADATA if rank is None else f"__{rank}{METADATA}"
        shown = f"{self.shown}/{name}" if self.shown else None
        metadata = read_metadata(Path(self.path) / name, shown)
        storage_meta: dcp_metadata.StorageMeta | None = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = dcp_metadata.StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """The default planner, its non-tensor items loaded with ``weights_only=True``."""

    def __init__(self, shown: object) -> None:
        super().__init__()
        self.shown = shown

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        loaded = load_torch(value.getvalue(), f"{self.shown} (DCP item {fqn})")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def load(state: dict, directory: Path, shown: str | None = None) -> None:
    """``dcp.load(state)`` from ``directory`` with ``SafeReader`` and ``SafePlanner`` (collective).
    An unsafe file raises its ``UnsafeCheckpointError`` itself, not DCP's many-line wrapper
    (``.metadata`` is read here first: DCP folds a failed metadata read into an AssertionError)."""
    read_metadata(Path(directory) / METADATA, f"{shown}/{METADATA}" if shown else None)
    try:
        dcp.load(state, storage_reader=SafeReader(Path(directory), shown), planner=SafePlanner(shown or directory))
    except CheckpointException as exc:
        for error, _ in exc.failures.values():
            if isinstance(error, UnsafeCheckpointError):
                raise UnsafeCheckpointError(str(error)) from None
        raise
