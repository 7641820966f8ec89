"""Committed training shards of one window: Arrow IPC files plus a manifest, made visible
atomically (a reader sees a whole window or none of it).

Readers only trust directories that hold ``manifest.json``. On a local disk the writer builds
the window in a hidden sibling directory and renames it into place in one step. On S3 or
WebHDFS (a ``primus_lib.storage.StorageLocation``: object stores have no rename) it writes the
parts under names unique to this writer, then the manifest LAST (one PUT); a reader accepts a
window only when the manifest exists and every part it names has the recorded size, and checks
each part's sha256 as it reads it. A killed writer leaves orphan parts that no manifest names:
never read, removed by ``sweep_orphans`` once older than ``ORPHAN_AGE_SECONDS`` (a re-run of
the window sweeps them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa

from primus_lib.durable import fsync_path, ipc_bytes, write_ipc_digest
from primus_lib.storage import StorageLocation, locate, unique_name

MANIFEST = "manifest.json"
ORPHAN_AGE_SECONDS = 3600.0  # a part no manifest names, this old, belongs to a dead writer
Where = Path | StorageLocation | str


@dataclass(frozen=True)
class ShardInfo:
    file: str
    rows: int
    sha256: str
    size: int = 0  # bytes; 0 in manifests written before it was recorded


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
    directory: Where,
    table: pa.Table,
    *,
    stream: str,
    window: str,
    seed: int,
    rows_per_shard: int,
    extra: dict | None = None,
) -> Manifest:
    """Write ``table`` as fixed-size shards and commit them; a committed window is kept as is."""
    directory = locate(directory)
    existing = read_manifest(directory)
    if existing is not None:
        return existing
    if isinstance(directory, StorageLocation):
        return _write_remote(directory, table, stream, window, seed, rows_per_shard, extra)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        # shard i's fsync (a wait on the disk, not CPU) runs on an I/O thread while shard i+1 is encoded
        with ThreadPoolExecutor(max(1, pa.io_thread_count()), thread_name_prefix="primus-fsync") as syncs:

            def write(job: tuple[int, pa.Table]) -> tuple[ShardInfo, Future]:
                shard = _write_local(staging, *job)
                return shard, syncs.submit(fsync_path, staging / shard.file)

            written = _map(write, _parts(table, rows_per_shard))
            shards = [shard for shard, synced in written if synced.result() is None]
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


def _parts(table: pa.Table, rows_per_shard: int) -> list[tuple[int, pa.Table]]:
    return [(i, table.slice(o, rows_per_shard)) for i, o in enumerate(range(0, max(table.num_rows, 1), rows_per_shard))]


def _map(fn, items: list) -> list:
    """``fn`` over ``items`` in order, on ``pa.cpu_count()`` threads (IPC encoding, sha256, write and
    fsync all release the GIL), so an executor allotted N cores commits on N."""
    threads = min(pa.cpu_count(), len(items))
    if threads <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(threads, thread_name_prefix="primus-shards") as pool:
        return list(pool.map(fn, items))


def _write_local(staging: Path, index: int, part: pa.Table) -> ShardInfo:
    """One shard's bytes written (not yet fsynced: the caller does) and described."""
    name = f"part-{index:05d}.arrow"
    digest = hashlib.sha256()
    size = write_ipc_digest(staging / name, part, digest)  # the bytes of ipc_bytes(part), hashed as written
    return ShardInfo(name, part.num_rows, digest.hexdigest(), size)


def _write_remote(directory: StorageLocation, table: pa.Table, stream: str, window: str, seed: int,
                  rows_per_shard: int, extra: dict | None) -> Manifest:  # fmt: skip
    sweep_orphans(directory)
    shards = []
    for index, offset in enumerate(range(0, max(table.num_rows, 1), rows_per_shard)):
        part = table.slice(offset, rows_per_shard)
        data = ipc_bytes(part)
        name = unique_name(f"part-{index:05d}", ".arrow")
        (directory / name).write_bytes(data)
        shards.append(ShardInfo(name, part.num_rows, hashlib.sha256(data).hexdigest(), len(data)))
    manifest = Manifest(stream, window, table.num_rows, seed, shards, extra or {})
    (directory / MANIFEST).put_atomic(manifest.to_json().encode())  # the commit point, last
    return manifest


def sweep_orphans(directory: Where, min_age: float = ORPHAN_AGE_SECONDS) -> int:
    """Delete parts of a remote window that its manifest does not name and that are older than
    ``min_age`` seconds (a live writer's parts are younger); returns how many."""
    directory = locate(directory)
    if not isinstance(directory, StorageLocation):
        return 0
    manifest = read_manifest(directory, verify=False)
    named = {s.file for s in manifest.shards} if manifest else set()
    now, removed = time.time(), 0
    for entry in directory.list():
        if entry.is_dir or entry.name == MANIFEST or entry.name in named:
            continue
        if entry.mtime is not None and now - entry.mtime < min_age:
            continue
        (directory / entry.name).delete()
        removed += 1
    return removed


def read_manifest(directory: Where, verify: bool = True) -> Manifest | None:
    """The window's manifest, None when it is not committed. On remote storage ``verify`` also
    requires every part the manifest names to exist with its recorded size."""
    directory = locate(directory)
    if isinstance(directory, StorageLocation):
        try:
            manifest = Manifest.from_json((directory / MANIFEST).read_text())
        except FileNotFoundError:
            return None
        if verify:
            sizes = {e.name: e.size for e in directory.list() if not e.is_dir}
            for shard in manifest.shards:
                if sizes.get(shard.file) != shard.size:
                    raise ValueError(f"{directory}: committed part {shard.file} is missing or has the wrong size")
        return manifest
    path = Path(directory) / MANIFEST
    try:
        return Manifest.from_json(path.read_text())
    except FileNotFoundError:
        return None


def read_window(directory: Where) -> pa.Table:
    return pa.concat_tables(list(iter_window(directory))) if read_manifest(directory) else pa.table({})


def iter_window(directory: Where, start_shard: int = 0) -> Iterator[pa.Table]:
    """The committed shards of a window in order, from ``start_shard`` on."""
    directory = locate(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        raise FileNotFoundError(f"{directory}: no committed window (manifest.json missing)")
    for shard in manifest.shards[start_shard:]:
        yield read_shard(directory, shard)


def read_shard(directory: Where, shard: ShardInfo) -> pa.Table:
    """One committed shard: memory-mapped on a local disk, fetched and checksummed remotely."""
    directory = locate(directory)
    if isinstance(directory, StorageLocation):
        data = (directory / shard.file).read_bytes()
        if hashlib.sha256(data).hexdigest() != shard.sha256:
            raise ValueError(f"{directory / shard.file}: sha256 does not match the manifest")
        return pa.ipc.open_file(pa.py_buffer(data)).read_all()
    with pa.memory_map(str(Path(directory) / shard.file)) as source:
        return pa.ipc.open_file(source).read_all()
