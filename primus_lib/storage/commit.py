"""The one commit protocol of job state: parts first under names of their own, a manifest LAST.

Committed windows (``manifest.json``), trainer checkpoints (``checkpoint.json``) and sharded
models (``meta.json``) commit the same way on every backend, the local disk included:

1. the writer puts its parts into the directory under names no other writer uses (``Parts``);
   nothing publishes them yet;
2. it makes them durable (an fsync locally; a PUT is on return) and puts the manifest LAST with
   ``put_atomic`` (locally temp file, fsync, rename, fsync of the directory; one PUT on S3; a
   rename-over on HDFS), naming every part with its size (and sha256 where the contract wants
   integrity);
3. a reader trusts only what a committed manifest names, and only once every named part has its
   recorded size (``verify``); a part it reads is checked against the recorded size and sha256
   (``read_part``).

One recovery rule: a part no committed manifest names is garbage. A writer that fails removes its
own parts at once (``Parts`` as a context); a killed one leaves them, never read, and the next
commit into the same place removes the garbage that cannot belong to a live writer (``sweep``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from primus_lib.durable import Digesting
from primus_lib.storage.location import StorageLocation
from primus_lib.storage.remote import StorageUnavailable
from primus_lib.storage.uri import unique_name


@dataclass(frozen=True)
class Part:
    name: str
    size: int
    sha256: str


class Parts:
    """One writer's parts in ``directory``, published by ``commit`` (as a context: removed on failure)."""

    def __init__(self, directory: StorageLocation):
        self.directory = directory
        self.written: list[str] = []
        self._unsynced: list[str] = []

    def name(self, stem: str, suffix: str = "") -> str:
        """A part name of this writer's own (``stem-<nonce>suffix``)."""
        return unique_name(stem, suffix)

    @contextmanager
    def writer(self, name: str) -> Iterator[Digesting]:
        """A file for the part ``name``; after the block ``.size`` and ``.digest`` describe it."""
        self.written.append(name)
        with (self.directory / name).writer(durable=False) as handle:
            out = Digesting(handle, hashlib.sha256())
            yield out
        self._unsynced.append(name)

    def put(self, name: str, data: bytes) -> Part:
        with self.writer(name) as out:
            out.write(data)
        return Part(name, out.size, out.digest.hexdigest())

    def put_files(self, source: Path) -> dict[str, int]:
        """Every file under the local directory ``source`` as a part, durable; name -> size."""
        sizes = self.directory.put_files(source)
        self.written += list(sizes)
        return sizes

    def commit(self, manifest: str, document: bytes) -> None:
        """Make the parts durable, then put the manifest: the commit point."""
        targets = [self.directory / name for name in self._unsynced]
        if targets:
            with ThreadPoolExecutor(min(8, len(targets)), thread_name_prefix="primus-sync") as pool:
                list(pool.map(StorageLocation.sync, targets))
        (self.directory / manifest).put_atomic(document)
        self.written, self._unsynced = [], []

    def abort(self) -> None:
        """Remove this writer's uncommitted parts (best effort: a store that is away keeps them, as
        garbage for ``sweep``), and the directory when that leaves it empty."""
        try:
            for name in self.written:
                (self.directory / name).delete()
            self.directory.remove_if_empty()
        except OSError:
            pass
        self.written, self._unsynced = [], []

    def __enter__(self) -> Parts:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None and not isinstance(value, StorageUnavailable):  # a store away: nothing to ask it
            self.abort()


def verify(directory: StorageLocation, sizes: dict[str, int], manifest: str) -> None:
    """Raise ValueError unless every part ``sizes`` names is in ``directory`` with that size (0: a
    size the manifest did not record)."""
    found = {e.name: e.size for e in directory.list() if not e.is_dir}
    for name, size in sizes.items():
        if name not in found or (size and found[name] != size):
            raise ValueError(f"{directory}: committed part {name} is missing or has the wrong size ({manifest})")


def read_part(directory: StorageLocation, part: Part, manifest: str):
    """The part's bytes (an Arrow buffer), checked against the size and sha256 ``manifest`` records."""
    where = directory / part.name
    try:
        data = where.read_buffer(checked=bool(part.size and part.sha256))
    except FileNotFoundError:
        raise ValueError(f"{where}: committed part is missing ({directory / manifest} names it)") from None
    if part.size and data.size != part.size:
        raise ValueError(f"{where}: {data.size} bytes, {directory / manifest} records {part.size}")
    if part.sha256 and hashlib.sha256(data).hexdigest() != part.sha256:
        raise ValueError(f"{where}: sha256 does not match {directory / manifest}")
    return data


def sweep(directory: StorageLocation, keep: Collection[str], before: float) -> int:
    """Delete the entries of ``directory`` not in ``keep`` (what committed manifests name) last
    modified before ``before`` (epoch seconds; a live writer's parts are younger); returns how many."""
    removed = 0
    for entry in directory.list():
        if entry.name in keep or (entry.mtime is not None and entry.mtime >= before):
            continue
        (directory / entry.name).delete()
        removed += 1
    return removed
