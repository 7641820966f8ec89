"""Committed training shards of one window: Arrow IPC files plus a manifest, made visible
atomically (a reader sees a whole window or none of it).

Readers only trust directories that hold ``manifest.json``; the writer builds the window in
a hidden sibling directory and renames it into place in one step.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa

from primus_lib.durable import fsync_path, write_ipc

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ShardInfo:
    file: str
    rows: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    stream: str
    window: str
    rows: int
    seed: int
    shards: list[ShardInfo] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        raw["shards"] = [ShardInfo(**s) for s in raw["shards"]]
        return cls(**raw)


def write_window(
    directory: Path,
    table: pa.Table,
    *,
    stream: str,
    window: str,
    seed: int,
    rows_per_shard: int,
    extra: dict | None = None,
) -> Manifest:
    """Write ``table`` as fixed-size shards and commit them; a committed window is kept as is."""
    directory = Path(directory)
    existing = read_manifest(directory)
    if existing is not None:
        return existing
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        shards = []
        for index, offset in enumerate(range(0, max(table.num_rows, 1), rows_per_shard)):
            part = table.slice(offset, rows_per_shard)
            name = f"part-{index:05d}.arrow"
            digest = write_ipc(staging / name, part)
            shards.append(ShardInfo(name, part.num_rows, digest))
        manifest = Manifest(stream, window, table.num_rows, seed, shards, extra or {})
        (staging / MANIFEST).write_text(manifest.to_json())
        fsync_path(staging / MANIFEST)  # the commit point's content must reach the disk before the rename
        fsync_path(staging)
        try:
            os.rename(staging, directory)
        except OSError:
            if read_manifest(directory) is None:  # lost a race with nobody: a real error
                raise
            shutil.rmtree(staging, ignore_errors=True)
            return read_manifest(directory)  # type: ignore[return-value]
        fsync_path(directory.parent)
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def read_manifest(directory: Path) -> Manifest | None:
    path = Path(directory) / MANIFEST
    try:
        return Manifest.from_json(path.read_text())
    except FileNotFoundError:
        return None


def read_window(directory: Path) -> pa.Table:
    return pa.concat_tables(list(iter_window(directory))) if read_manifest(directory) else pa.table({})


def iter_window(directory: Path, start_shard: int = 0) -> Iterator[pa.Table]:
    """The committed shards of a window in order, from ``start_shard`` on."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise FileNotFoundError(f"{directory}: no committed window (manifest.json missing)")
    for shard in manifest.shards[start_shard:]:
        with pa.memory_map(str(Path(directory) / shard.file)) as source:
            yield pa.ipc.open_file(source).read_all()
