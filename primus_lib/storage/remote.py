"""Object stores and HDFS as backends of the store: retries while the store is away, HDFS's rename.

A store that is unreachable or answers "try again" (a restart, 5xx, SlowDown) costs each remote
call a bounded wait (``primus_lib.storage.RETRY_SECONDS``, 120 s: a library default, not a
setting), then a ``StorageUnavailable`` naming the object; a store this process never reached (a
wrong endpoint) fails at once. Every wrapped call is safe to repeat: a PUT replaces the whole
object, a read or delete changes nothing more the second time. Local calls are never retried.
"""

from __future__ import annotations

import functools
import logging
import random
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from primus_lib.storage.location import StorageLocation

log = logging.getLogger("primus_lib.storage")
P = ParamSpec("P")
R = TypeVar("R")
# What the AWS SDK (through pyarrow) and the WebHDFS client say when the store is away or busy.
_TRANSIENT = (
    "NETWORK_CONNECTION",
    "curlCode",
    "SERVICE_UNAVAILABLE",
    "SLOW_DOWN",
    "INTERNAL_FAILURE",
    "REQUEST_TIMEOUT",
    "THROTTLING",
    "Connection refused",
    "Couldn't connect",
    "timed out",
    "HTTP response code: 5",
    "Max retries exceeded",
)
_REACHED: set[int] = set()  # id() of the (cached, shared) filesystems that answered once


class StorageUnavailable(OSError):
    """The object store stayed unreachable (or kept answering "try again") past the retry bound."""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, FileNotFoundError | FileExistsError | PermissionError | IsADirectoryError):
        return False
    return isinstance(exc, ConnectionError | TimeoutError) or (
        isinstance(exc, OSError) and any(mark in str(exc) for mark in _TRANSIENT)
    )


def retried(call: Callable[Concatenate[StorageLocation, P], R]) -> Callable[Concatenate[StorageLocation, P], R]:
    """``call`` asked again while its remote store is away, up to ``RETRY_SECONDS``."""

    @functools.wraps(call)
    def run(where: StorageLocation, *args: P.args, **kwargs: P.kwargs) -> R:
        if where.scheme == "file":
            return call(where, *args, **kwargs)
        from primus_lib import storage  # the bound is read per call: tests shorten it in-process

        bound = storage.RETRY_SECONDS

        def outage(exc: BaseException) -> bool:
            return _transient(exc) and id(where.fs) in _REACHED

        retrying = Retrying(
            retry=retry_if_exception(outage),
            stop=stop_after_delay(bound),
            wait=wait_exponential(multiplier=0.1, max=3.0),
            before_sleep=lambda state: log.warning(
                "%s: %s failed (%s), attempt %d; retrying",
                where,
                call.__name__,
                first_line(state.outcome.exception() if state.outcome is not None else None),  # tenacity sets it first
                state.attempt_number,
            ),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    result = call(where, *args, **kwargs)
                    _REACHED.add(id(where.fs))
                    return result
        except OSError as exc:
            if not outage(exc):
                raise
            raise StorageUnavailable(
                f"{where}: {call.__name__} failed for {bound:.0f}s (the retry bound), the store is "
                f"unreachable: {first_line(exc)}"
            ) from None
        raise AssertionError("unreachable: tenacity re-raises the last error")

    return run


def first_line(exc: BaseException | None) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _replaced_under_reader(exc: BaseException) -> bool:
    """What fsspec's WebHDFS client raises when the file it opened was replaced or removed."""
    return isinstance(exc, FileNotFoundError) or "out of the range" in str(exc)


def _same_version(before: pafs.FileInfo, after: pafs.FileInfo) -> bool:
    return (after.type, after.size, after.mtime) == (before.type, before.size, before.mtime)


@retried
def read_bytes(where: StorageLocation, checked: bool = False) -> bytes:
    """The object's bytes; FileNotFoundError when it does not exist.

    S3: the object opened for random access and read whole, a HEAD then one GET (its input stream
    fetched it in ranges of ~256 KB: 25 GETs for 6 MB). On WebHDFS a file that ``put_atomic`` replaces
    while it is read (a registry heartbeat) is read again: the WebHDFS client sizes its reads at open,
    so a replacement of another length fails the read or cuts it short. ``checked``: the caller checks
    the bytes against a recorded size and sha256 (a committed part), which no other version passes:
    read once by a WebHDFS OPEN, without the status calls before, at and after the read (5 requests to
    the NameNode -> 1)."""
    import pyarrow.fs as pafs

    from primus_lib import storage

    if where.scheme == "webhdfs" and checked:
        return _webhdfs_open(where)
    if where.scheme != "webhdfs":
        try:
            with where.fs.open_input_file(where.path) as handle:
                return handle.read()
        except IsADirectoryError:
            raise FileNotFoundError(str(where)) from None
    deadline, attempts = time.monotonic() + storage.REREAD_SECONDS, 0
    while True:
        attempts += 1
        before = where.fs.get_file_info(where.path)
        if before.type != pafs.FileType.File:
            raise FileNotFoundError(str(where))
        try:
            with where.fs.open_input_stream(where.path) as stream:
                data = stream.read()
        except (RuntimeError, OSError) as exc:
            if not _replaced_under_reader(exc):
                raise
        else:
            if _same_version(before, where.fs.get_file_info(where.path)):
                return data
        if time.monotonic() >= deadline:
            break
        time.sleep(random.uniform(0, min(0.5, 0.02 * 2**attempts)))  # out of step with the writer
    raise OSError(f"{where}: replaced while being read, {attempts} times in {storage.REREAD_SECONDS:.0f}s")


@retried
def write_bytes(where: StorageLocation, data: bytes) -> None:
    """One PUT (visible whole on S3 once it completes; not atomic on HDFS)."""
    if where.scheme == "webhdfs":
        _webhdfs_create(where, data)
        return
    if where.scheme != "s3":  # S3 has no directories; HDFS wants the parent
        where.fs.create_dir(where.parent.path, recursive=True)
    with where.fs.open_output_stream(where.path) as stream:
        stream.write(data)


def _webhdfs_open(where: StorageLocation) -> bytes:
    """WebHDFS OPEN of the whole file: the NameNode's redirect, then one GET from the DataNode."""
    client = where.fs.handler.fs
    redirect = client._call("OPEN", path=where.path, redirect=False)
    location = redirect.headers.get("Location")
    if location is None:  # answered by the NameNode itself
        return redirect.content
    got = client.session.get(client._apply_proxy(location))
    got.raise_for_status()
    return got.content


def _webhdfs_create(where: StorageLocation, data: bytes) -> None:
    """WebHDFS CREATE with the data: the NameNode's redirect, then one PUT of the bytes to the DataNode;
    the NameNode makes missing parent directories. fsspec's writer made the parent (MKDIRS), created an
    empty file (CREATE + PUT) and appended to it (APPEND + POST): 3 NameNode requests a file, and 2
    DataNode ones, where this takes one of each."""
    client = where.fs.handler.fs
    redirect = client._call("CREATE", "PUT", where.path, redirect=False, overwrite="true")
    sent = client.session.put(
        client._apply_proxy(redirect.headers["Location"]),
        data=data,
        headers={"content-type": "application/octet-stream"},
    )
    sent.raise_for_status()


def put_atomic(where: StorageLocation, data: bytes) -> None:
    """S3: one PUT (an object is never seen half-written); HDFS: a temp file renamed over the
    target in one step, so a reader finds the old version or the new one, never neither."""
    if where.scheme == "s3":
        write_bytes(where, data)
        return
    tmp = where.parent / f".{where.name}.tmp-{uuid.uuid4().hex[:8]}"
    write_bytes(tmp, data)
    try:
        if where.scheme == "webhdfs":
            _rename_over(where, tmp, data)
        else:  # libhdfs' move does not overwrite
            if exists(where):
                delete(where)
            where.fs.move(tmp.path, where.path)
    except BaseException:
        delete(tmp)
        raise


@retried
def _rename_over(where: StorageLocation, source: StorageLocation, data: bytes) -> None:
    """WebHDFS RENAME with ``renameoptions=OVERWRITE``: the NameNode's rename2, which replaces
    the target atomically (fsspec's ``mv`` has no such option, hence its raw call).

    Asked again after an outage, the source may be gone because the first rename landed and only
    its answer was lost: done when the target holds ``data``."""
    client = where.fs.handler.fs
    try:
        client._call("RENAME", method="put", path=source.path, destination=where.path, renameoptions="OVERWRITE")
    except FileNotFoundError:
        if exists(source) or not exists(where) or read_bytes(where) != data:
            raise


@retried
def exists(where: StorageLocation) -> bool:
    import pyarrow.fs as pafs

    return where.fs.get_file_info(where.path).type != pafs.FileType.NotFound


@retried
def info(where: StorageLocation, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
    return where.fs.get_file_info(selector)


@retried
def delete(where: StorageLocation) -> None:
    """Remove this file or directory tree; nothing happens when it is gone already."""
    import pyarrow.fs as pafs

    kind = where.fs.get_file_info(where.path).type
    try:
        if kind == pafs.FileType.Directory:
            where.fs.delete_dir(where.path)
        elif kind == pafs.FileType.File:
            where.fs.delete_file(where.path)
    except FileNotFoundError:
        pass


def refusing(error: Exception) -> pafs.FileSystem:
    """A filesystem whose every call raises ``error`` (a connection that could not be resolved)."""
    import pyarrow.fs as pafs

    def refuse(self, *args, **kwargs):
        raise type(error)(str(error))

    names = [n for n in dir(pafs.FileSystemHandler) if not n.startswith("_")]
    methods = {n: refuse for n in names if n != "get_type_name"}
    identity = {
        "__eq__": lambda self, other: self is other,
        "__ne__": lambda self, other: self is not other,
        "__hash__": object.__hash__,  # a class body with __eq__ alone would make it unhashable
    }
    body = {**methods, **identity, "get_type_name": lambda self: "unresolved"}
    return pafs.PyFileSystem(type("Refusing", (pafs.FileSystemHandler,), body)())
