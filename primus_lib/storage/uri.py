"""From a path or URI to a ``StorageLocation``: ``locate``."""

from __future__ import annotations

import functools
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from primus_lib.storage.location import StorageLocation
from primus_lib.storage.remote import refusing

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from primus_lib.credentials import StorageCredentials

REMOTE_SCHEMES = ("s3", "webhdfs")
Where = str | os.PathLike | StorageLocation  # what ``locate`` takes: a location, a local path or a URI


def scheme_of(uri: str) -> str:
    return uri.partition("://")[0].lower() if "://" in uri else "file"


def locate(target: Where, credentials: StorageCredentials | None = None) -> StorageLocation:
    """The location of ``target``: a local path (or ``file://`` URI), ``s3://`` or ``webhdfs://``;
    ``credentials``: the remote store's (None: the process's default storage connection, else the
    SDK's defaults)."""
    if isinstance(target, StorageLocation):
        return target
    text = os.fspath(target)
    scheme = scheme_of(text)
    if scheme == "file":
        path = Path(text.removeprefix("file://")).absolute()
        return StorageLocation(_local_fs(), str(path), "file")
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(f"{text}: unsupported storage scheme {scheme!r} (expected a local path, s3:// or webhdfs://)")
    from primus_lib.filesystems import resolve

    where = resolve(text, credentials)
    return StorageLocation(where.fs, where.path.rstrip("/") or "/", where.scheme, where.authority)


def local_directory(root: str | os.PathLike | None) -> Path | None:
    """The directory on this machine a storage root names, None for a remote store (or no root):
    where a job may keep what is not shared (SQLite, locks, logs) beside its state."""
    if root is None:
        return None
    text = os.fspath(root)
    if scheme_of(text) in REMOTE_SCHEMES:
        return None
    return Path(locate(text).path)


@functools.cache
def _local_fs() -> pafs.FileSystem:
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem()


def unique_name(stem: str, suffix: str) -> str:
    """``stem-<nonce>suffix``: parts of one writer never collide with another's."""
    return f"{stem}-{uuid.uuid4().hex[:12]}{suffix}"


def unresolved(uri: str, error: Exception) -> StorageLocation:
    """A location of ``uri`` whose every filesystem call raises ``error`` (a connection that could
    not be resolved): paths and URIs can still be computed (a DAG parse, an annotation), and the
    error names the connection where the store is first used."""
    where = uri.partition("://")[2]
    return StorageLocation(refusing(error), where.rstrip("/") or "/", scheme_of(uri), where.split("/", 1)[0])
