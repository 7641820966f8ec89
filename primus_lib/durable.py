"""Writes that survive a crash: fsync of files and directories, atomic text files, Arrow IPC
files with checksums.

A commit point (a rename) is only durable once what it names and the directory holding it
have reached the disk; these helpers are shared by shards, staged task outputs, checkpoints
and progress.json. pyarrow is imported only by ``ipc_bytes``/``write_ipc``: the light readers of job state
(the Airflow trigger, DAG parsing) import this module too. A write that fails without naming its
file (a full disk: ENOSPC, a quota, EIO) is re-raised naming it (``naming``).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


@contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise an OSError that names no file (``write``'s "No space left on device") with ``path``
    in it, so the operator learns which filesystem is full."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a directory (a directory's fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` by temp file + fsync + rename (+ fsync of the directory, so
    the rename itself survives a crash); a failed write leaves no temp file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with naming(path), open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def ipc_bytes(table: pa.Table) -> pa.Buffer:
    """``table`` as the bytes of an Arrow IPC file (what ``write_ipc`` writes)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def write_ipc(path: Path, table: pa.Table, fsync: bool = True) -> str:
    """Write ``table`` as an Arrow IPC file (fsynced unless told not to); return its sha256."""
    data = ipc_bytes(table)
    with naming(path), open(path, "wb") as handle:
        handle.write(data)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    return hashlib.sha256(data).hexdigest()
