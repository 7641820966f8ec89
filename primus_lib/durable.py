"""Writes that survive a crash: fsync of files and directories, Arrow IPC files with checksums.

A commit point (a rename) is only durable once what it names and the directory holding it
have reached the disk; these helpers are shared by shards, staged task outputs and
checkpoints.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pyarrow as pa


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a directory (a directory's fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_ipc(path: Path, table: pa.Table, fsync: bool = True) -> str:
    """Write ``table`` as an Arrow IPC file (fsynced unless told not to); return its sha256."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue()
    with open(path, "wb") as handle:
        handle.write(data)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    return hashlib.sha256(data).hexdigest()
