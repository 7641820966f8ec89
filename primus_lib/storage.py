"""Job state on shared storage: a ``StorageLocation`` is a filesystem plus a path in it.

``spec.storage.root`` may be a local path (``file://``), ``s3://bucket/prefix`` or
``webhdfs://host:port/path``; ``locate`` maps it to a location through
``primus_lib.filesystems.resolve`` (S3 endpoint and credentials from the environment, the
NameNode from the URI or ``PRIMUS_WEBHDFS_URL``). Local paths keep their rename-based commits
(``durable.py``); on a remote location the writers of windows, checkpoints and metric snapshots
commit by writing the data parts first under unique names and a small commit file LAST
(``put_atomic``: one PUT on S3, which has no rename and never shows half an object; temp file +
rename on HDFS). Readers trust only what a commit file names and verify it.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow.fs as pafs

REMOTE_SCHEMES = ("s3", "webhdfs")


def scheme_of(uri: str) -> str:
    return uri.partition("://")[0].lower() if "://" in uri else "file"


@dataclass(frozen=True)
class Entry:
    """One child of a listed location."""

    name: str
    is_dir: bool
    size: int
    mtime: float | None  # seconds since the epoch, when the store reports it


@dataclass(frozen=True)
class StorageLocation:
    """A path on a (remote) filesystem; ``/`` joins, ``str`` is the URI."""

    fs: pafs.FileSystem
    path: str  # inside ``fs``, without a trailing slash (``bucket/key`` on S3)
    scheme: str
    authority: str = ""

    def __truediv__(self, name: str) -> StorageLocation:
        return StorageLocation(self.fs, f"{self.path.rstrip('/')}/{name}", self.scheme, self.authority)

    def __fspath__(self) -> str:
        raise TypeError(
            f"{self} is on remote storage, which this step does not support yet (it needs a local "
            "spec.storage.root); code reads and writes remote state through primus_lib.storage"
        )

    def __str__(self) -> str:
        if self.scheme == "s3":
            return "s3://" + self.path
        return f"{self.scheme}://{self.authority}{self.path if self.path.startswith('/') else '/' + self.path}"

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> StorageLocation:
        return StorageLocation(self.fs, self.path.rstrip("/").rsplit("/", 1)[0], self.scheme, self.authority)

    # -- reading -------------------------------------------------------------------------------
    def read_bytes(self) -> bytes:
        """The object's bytes; FileNotFoundError when it does not exist."""
        import pyarrow.fs as pafs

        if self.fs.get_file_info(self.path).type != pafs.FileType.File:
            raise FileNotFoundError(str(self))
        with self.fs.open_input_stream(self.path) as stream:
            return stream.read()

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def list(self) -> list[Entry]:
        """The children of this directory (prefix), sorted by name; [] when there is none."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path, allow_not_found=True)
        entries = []
        for info in self.fs.get_file_info(selector):
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            is_dir = info.type == pafs.FileType.Directory
            entries.append(Entry(info.base_name, is_dir, info.size or 0, mtime))
        return sorted(entries, key=lambda e: e.name)

    # -- writing -------------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> None:
        """Write the object (visible whole on S3 once the PUT completes; not atomic on HDFS)."""
        if self.scheme != "s3":  # S3 has no directories; HDFS wants the parent
            self.fs.create_dir(self.parent.path, recursive=True)
        with self.fs.open_output_stream(self.path) as stream:
            stream.write(data)

    def put_atomic(self, data: bytes) -> None:
        """Publish ``data`` whole or not at all: a commit point. S3: one PUT (an object is never
        seen half-written); HDFS: a temp file renamed into place."""
        if self.scheme == "s3":
            self.write_bytes(data)
            return
        tmp = self.parent / f".{self.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.write_bytes(data)
        try:
            if self.exists():
                self.delete()
            self.fs.move(tmp.path, self.path)
        except BaseException:
            tmp.delete()
            raise

    def delete(self) -> None:
        """Remove this file or directory tree; nothing happens when it is gone already."""
        import pyarrow.fs as pafs

        kind = self.fs.get_file_info(self.path).type
        try:
            if kind == pafs.FileType.Directory:
                self.fs.delete_dir(self.path)
            elif kind == pafs.FileType.File:
                self.fs.delete_file(self.path)
        except FileNotFoundError:
            pass


def is_remote(target: object) -> bool:
    """Whether ``target`` (a Path, a URI string or a StorageLocation) lives on shared remote storage."""
    if isinstance(target, StorageLocation):
        return True
    return isinstance(target, str) and scheme_of(target) in REMOTE_SCHEMES


def locate(target: str | os.PathLike | StorageLocation) -> StorageLocation | Path:
    """A StorageLocation for a remote URI (or location), else the local Path."""
    if isinstance(target, StorageLocation):
        return target
    text = os.fspath(target)
    scheme = scheme_of(text)
    if scheme == "file":
        return Path(text[len("file://") :] if text.startswith("file://") else text).absolute()
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(f"{text}: unsupported storage scheme {scheme!r} (expected a local path, s3:// or webhdfs://)")
    from primus_lib.filesystems import resolve

    where = resolve(text)
    return StorageLocation(where.fs, where.path.rstrip("/") or "/", where.scheme, where.authority)


def unique_name(stem: str, suffix: str) -> str:
    """``stem-<nonce>suffix``: parts of one writer never collide with another's."""
    return f"{stem}-{uuid.uuid4().hex[:12]}{suffix}"
