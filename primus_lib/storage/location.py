"""``StorageLocation``: a filesystem (pyarrow.fs) and a path in it, local disk or remote store alike.

Every operation job state needs is here, and each means the same on every backend; how a backend
achieves it (an fsync and a rename locally, one PUT on S3, a rename-over on HDFS) is its own
business (``local.py``, ``remote.py``).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from primus_lib.storage import local, remote

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs


@dataclass(frozen=True)
class Entry:
    """One child of a listed location."""

    name: str
    is_dir: bool
    size: int
    mtime: float | None  # seconds since the epoch, when the store reports it


@dataclass(frozen=True)
class StorageLocation:
    """A path on a filesystem; ``/`` joins, ``str`` is the URI (a plain path on the local disk)."""

    fs: pafs.FileSystem
    path: str  # inside ``fs``, without a trailing slash (``bucket/key`` on S3, absolute locally)
    scheme: str  # "file", "s3", "webhdfs" or "hdfs"
    authority: str = ""

    def __truediv__(self, name: str) -> StorageLocation:
        return StorageLocation(self.fs, f"{self.path.rstrip('/')}/{name}", self.scheme, self.authority)

    def __fspath__(self) -> str:
        """The OS path of a local location, for tools and tests; the store's own operations are
        what Primus code uses, on every backend."""
        if self._local:
            return self.path
        raise TypeError(f"{self} is on remote storage: read and write it through primus_lib.storage")

    def __str__(self) -> str:
        if self._local:
            return self.path
        if self.scheme == "s3":
            return "s3://" + self.path
        return f"{self.scheme}://{self.authority}{self.path if self.path.startswith('/') else '/' + self.path}"

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> StorageLocation:
        return StorageLocation(self.fs, self.path.rstrip("/").rsplit("/", 1)[0] or "/", self.scheme, self.authority)

    @property
    def _local(self) -> bool:
        return self.scheme == "file"

    # -- reading -------------------------------------------------------------------------------
    def read_bytes(self) -> bytes:
        """The file's bytes; FileNotFoundError when it does not exist."""
        return Path(self.path).read_bytes() if self._local else remote.read_bytes(self)

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def read_buffer(self, checked: bool = False) -> pa.Buffer:
        """The file's bytes as an Arrow buffer: memory-mapped on the local disk, fetched remotely.
        ``checked``: the caller checks them against a recorded size and sha256 (``remote.read_bytes``)."""
        import pyarrow as pa

        if self._local:
            with pa.memory_map(self.path) as mapped:
                return mapped.read_buffer()
        return pa.py_buffer(remote.read_bytes(self, checked))

    def exists(self) -> bool:
        return remote.exists(self)

    def list(self) -> list[Entry]:
        """The children of this directory (prefix), sorted by name; [] when there is none."""
        import pyarrow.fs as pafs

        entries = []
        for info in remote.info(self, pafs.FileSelector(self.path, allow_not_found=True)):
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            entries.append(Entry(info.base_name, info.type == pafs.FileType.Directory, info.size or 0, mtime))
        return sorted(entries, key=lambda e: e.name)

    def version(self) -> tuple[int, ...] | None:
        """A token that changes whenever this file is written, replaced or removed (for caches);
        None where the store has none (an object store's mtime has a second's grain)."""
        return local.version(Path(self.path)) if self._local else None

    # -- writing -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def writer(self, atomic: bool = False, durable: bool = True) -> Iterator[BinaryIO]:
        """A binary file to write this location's bytes into, published when the block ends: whole
        or not at all when ``atomic`` (else under its final name as written: a part), durable on
        return when ``durable`` (a PUT always is). Nothing stays behind when the block fails."""
        if self._local:
            with local.writer(Path(self.path), atomic, durable) as handle:
                yield handle
            return
        buffer = io.BytesIO()
        yield buffer
        if atomic:
            self.put_atomic(buffer.getvalue())
        else:
            remote.write_bytes(self, buffer.getvalue())

    def write_bytes(self, data: bytes, durable: bool = True) -> None:
        """Write the file (a part: not atomic, see ``put_atomic``)."""
        if not self._local:
            remote.write_bytes(self, data)
            return
        with self.writer(durable=durable) as handle:
            local.write_all(handle, data)

    def put_atomic(self, data: bytes, durable: bool = True) -> None:
        """Publish ``data`` whole or not at all: a commit point, a pointer, a registry entry. A
        reader finds the old version or the new one, never half and never neither. Locally it is
        durable (with whatever was written into the directory before) unless told otherwise."""
        if not self._local:
            remote.put_atomic(self, data)
            return
        with self.writer(atomic=True, durable=durable) as handle:
            local.write_all(handle, data)

    def put_if_absent(self, data: bytes) -> None:
        """Create the file with ``data`` unless it exists. Locally exclusive and readable by its
        owner only (0600); an object store has no create-if-absent: there the last PUT wins."""
        if self._local:
            local.put_if_absent(Path(self.path), data)
        else:
            remote.put_atomic(self, data)

    def sync(self) -> None:
        """Make what was written here durable (a PUT is on return; locally an fsync)."""
        if self._local:
            local.sync(Path(self.path))

    def delete(self) -> None:
        """Remove this file or directory tree; nothing happens when it is gone already."""
        remote.delete(self)

    def remove_if_empty(self) -> None:
        """Remove this directory if nothing is in it (object stores have no empty directories)."""
        if self._local:
            local.remove_if_empty(Path(self.path))

    # -- whole directories, for libraries that read and write files themselves (DCP) -------------
    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A private local directory to write this location's files into before ``put_files``
        (beside it on the local disk, so the files move in by rename); removed on exit."""
        if self._local:
            with local.staging(Path(self.path)) as where:
                yield where
            return
        with tempfile.TemporaryDirectory(prefix="primus-stage-") as where:
            yield Path(where)

    def put_files(self, source: Path) -> dict[str, int]:
        """Every file under the local directory ``source`` into this directory, durable; name -> size."""
        if self._local:
            return local.move_files(source, Path(self.path))
        sizes = {}
        for path in sorted(source.rglob("*")):
            if path.is_file():
                name = path.relative_to(source).as_posix()
                data = path.read_bytes()
                (self / name).write_bytes(data)
                sizes[name] = len(data)
        return sizes

    @contextlib.contextmanager
    def local_copy(self, files: dict[str, int] | None, manifest: object) -> Iterator[Path]:
        """A local directory holding this directory's ``files`` (name -> size, checked against
        ``manifest``, which records them; None: every file, unchecked): the directory itself on
        the local disk, else a private download removed on exit."""
        if self._local:
            local.check_sizes(Path(self.path), files or {}, manifest)
            yield Path(self.path)
            return
        names = files if files is not None else {e.name: e.size for e in self.list() if not e.is_dir}
        with tempfile.TemporaryDirectory(prefix="primus-copy-") as where:
            for name, size in names.items():
                data = (self / name).read_bytes()
                if len(data) != size:
                    raise ValueError(f"{self / name}: {len(data)} bytes, {manifest} records {size}")
                target = Path(where) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            yield Path(where)
