"""The local disk as a backend of the store: what a rename and an fsync give a local filesystem.

An atomic put is a temp file, fsync, fsync of the directory (so every part written there before
is durable too), rename over the target, fsync of the directory: a reader finds the old file or the
new one, and a crash after the put returns keeps the new one. A directory made on the way is
fsynced into its parent. A write that fails without naming its file (a full disk) is re-raised
naming it (``durable.naming``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from primus_lib.durable import fsync_path, naming


def makedirs(directory: Path, durable: bool = True) -> None:
    """``mkdir -p``; each directory made is fsynced into its parent when ``durable``."""
    missing = []
    while not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another writer made it meanwhile
            path.mkdir()
        if durable:
            fsync_path(path.parent)


@contextlib.contextmanager
def writer(path: Path, atomic: bool, durable: bool) -> Iterator[BinaryIO]:
    """An unbuffered file at ``path`` (through a temp name when ``atomic``); removed on failure."""
    makedirs(path.parent, durable)
    target = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}" if atomic else path
    try:
        with naming(path):
            with open(target, "wb", buffering=0) as handle:
                yield handle
                if durable:
                    os.fsync(handle.fileno())
            if atomic:
                if durable:
                    fsync_path(path.parent)  # the parts written beside it, before the commit point
                os.replace(target, path)
            if durable:
                fsync_path(path.parent)
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def write_all(handle: BinaryIO, data: bytes | memoryview) -> None:
    """Write all of ``data`` (an unbuffered write may take less than asked)."""
    view = memoryview(data).cast("B")
    while view:
        view = view[handle.write(view) :]


def put_if_absent(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data``, readable by its owner only, unless it exists (then theirs stands)."""
    makedirs(path.parent)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with naming(path), os.fdopen(fd, "wb") as handle:
            write_all(handle, data)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.link(tmp, path)
        fsync_path(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def version(path: Path) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime in ns): a rename or a write changes one; zeros when absent."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0, 0, 0)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def sync(path: Path) -> None:
    with naming(path):
        fsync_path(path)


@contextlib.contextmanager
def staging(target: Path) -> Iterator[Path]:
    """A private directory beside ``target`` (same filesystem: its files move in by rename)."""
    where = target.parent / f".{target.name}.stage-{uuid.uuid4().hex[:8]}"
    makedirs(where, durable=False)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def move_files(source: Path, target: Path) -> dict[str, int]:
    """Rename every file under ``source`` into ``target`` (fsynced there); name -> size."""
    sizes = {}
    for path in sorted(source.rglob("*")):
        if path.is_file():
            name = path.relative_to(source).as_posix()
            destination = target / name
            makedirs(destination.parent)
            with naming(destination):
                fsync_path(path)
                os.replace(path, destination)
            sizes[name] = destination.stat().st_size
    for directory in {(target / n).parent for n in sizes}:
        fsync_path(directory)
    return sizes


def check_sizes(directory: Path, files: dict[str, int], manifest: object) -> None:
    for name, size in files.items():
        try:
            found = (directory / name).stat().st_size
        except FileNotFoundError:
            raise FileNotFoundError(f"{directory / name}: missing, {manifest} names it") from None
        if found != size:
            raise ValueError(f"{directory / name}: {found} bytes, {manifest} records {size}")


def remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):
        directory.rmdir()
