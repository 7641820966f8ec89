"""Committed training shards of one window: Arrow IPC files plus a manifest, committed by the
store's one protocol (``primus_lib.storage.commit``): a reader sees a whole window or none of it.

The writer puts the parts under names unique to it (``part-NNNNN-<nonce>.arrow``), durable, then
``manifest.json`` LAST and atomically, on the local disk as on S3 or HDFS. A reader accepts a
window only when the manifest exists and every part it names has the recorded size, and checks
each part's sha256 as it reads it. A writer that fails removes its parts; a killed one leaves parts
no manifest names: never read, removed by ``sweep_orphans`` once older than
``ORPHAN_AGE_SECONDS`` (a retried task may write the same window at the same time: younger parts
may be a live writer's), which every commit of the window runs. Windows written before the
protocol (parts ``part-NNNNN.arrow`` in a directory renamed into place) read the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from primus_lib.durable import write_ipc
from primus_lib.storage import Part, Parts, Where, locate, read_part, sweep
from primus_lib.storage import verify as verify_parts

MANIFEST = "manifest.json"
ORPHAN_AGE_SECONDS = 3600.0  # a part no manifest names, this old, belongs to a dead writer


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
    with Parts(directory) as parts:

        def write(job: tuple[int, pa.Table]) -> ShardInfo:
            index, part = job
            name = parts.name(f"part-{index:05d}", ".arrow")
            with parts.writer(name) as out:
                write_ipc(out, part)
            return ShardInfo(name, part.num_rows, out.digest.hexdigest(), out.size)

        shards = _map(write, _parts(table, rows_per_shard))
        manifest = Manifest(stream, window, table.num_rows, seed, shards, extra or {})
        parts.commit(MANIFEST, manifest.to_json().encode())
    sweep_orphans(directory)
    return manifest


def _parts(table: pa.Table, rows_per_shard: int) -> list[tuple[int, pa.Table]]:
    return [(i, table.slice(o, rows_per_shard)) for i, o in enumerate(range(0, max(table.num_rows, 1), rows_per_shard))]


def _map(fn, items: list) -> list:
    """``fn`` over ``items`` in order, on ``pa.cpu_count()`` threads (IPC encoding, sha256 and the
    write release the GIL), so an executor allotted N cores commits on N."""
    threads = min(pa.cpu_count(), len(items))
    if threads <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(threads, thread_name_prefix="primus-shards") as pool:
        return list(pool.map(fn, items))


def sweep_orphans(directory: Where, min_age: float = ORPHAN_AGE_SECONDS) -> int:
    """Delete what of a window no committed manifest names and is older than ``min_age`` seconds
    (a live writer's parts are younger); returns how many."""
    directory = locate(directory)
    manifest = read_manifest(directory, verify=False)
    named = {s.file for s in manifest.shards} if manifest else set()
    return sweep(directory, named | {MANIFEST}, time.time() - min_age)


def read_manifest(directory: Where, verify: bool = True) -> Manifest | None:
    """The window's manifest, None when it is not committed; ``verify`` also requires every part
    the manifest names to exist with its recorded size."""
    directory = locate(directory)
    try:
        manifest = Manifest.from_json((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    if verify:
        verify_parts(directory, {s.file: s.size for s in manifest.shards}, MANIFEST)
    return manifest


def read_window(directory: Where) -> pa.Table:
    directory = locate(directory)
    manifest = read_manifest(directory, verify=False)  # each shard is checked as it is read
    return pa.concat_tables([read_shard(directory, s) for s in manifest.shards]) if manifest else pa.table({})


def iter_window(directory: Where, start_shard: int = 0) -> Iterator[pa.Table]:
    """The committed shards of a window in order, from ``start_shard`` on, each checked as it is read
    (its size and sha256): no listing of the window first (on S3 a request: 3 of a 4-shard window's 14)."""
    directory = locate(directory)
    manifest = read_manifest(directory, verify=False)
    if manifest is None:
        raise FileNotFoundError(f"{directory}: no committed window (manifest.json missing)")
    for shard in manifest.shards[start_shard:]:
        yield read_shard(directory, shard)


def read_shard(directory: Where, shard: ShardInfo) -> pa.Table:
    """One committed shard, its size and sha256 checked (memory-mapped on the local disk)."""
    data = read_part(locate(directory), Part(shard.file, shard.size, shard.sha256), MANIFEST)
    return pa.ipc.open_file(data).read_all()
