"""Job state on shared storage: a ``StorageLocation`` is a filesystem plus a path in it.

``spec.storage.root`` may be a local path (``file://``), ``s3://bucket/prefix`` or
``webhdfs://host:port/path``; ``locate`` maps it to a location through
``primus_lib.filesystems.resolve`` with the credentials of the spec's ``storage.connection_id``
(``primus_lib.credentials``; ``JobPaths.for_job`` resolves them). Local paths keep their rename-based commits
(``durable.py``); on a remote location the writers of windows, checkpoints and metric snapshots
commit by writing the data parts first under unique names and a small commit file LAST
(``put_atomic``: one PUT on S3, which has no rename and never shows half an object; temp file +
rename on HDFS). Readers trust only what a commit file names and verify it. A store that is
unreachable or answers "try again" (a restart, 5xx, SlowDown) costs each remote call a bounded wait
(``RETRY_SECONDS``, 120 s: a library default, not a setting), then a ``StorageUnavailable`` naming the object;
a store this process never reached (a wrong endpoint) fails at once.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from primus_lib.credentials import StorageCredentials

REMOTE_SCHEMES = ("s3", "webhdfs")
RETRY_SECONDS = 120.0  # how long a remote call waits out an unreachable store (tests shorten it in-process)
REREADS = 5  # reads of one HDFS file that another writer keeps replacing, before giving up
log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")
# What the AWS SDK (through pyarrow) and the WebHDFS client say when the store is away or busy.
_TRANSIENT = ("NETWORK_CONNECTION", "curlCode", "SERVICE_UNAVAILABLE", "SLOW_DOWN", "INTERNAL_FAILURE",
              "REQUEST_TIMEOUT", "THROTTLING", "Connection refused", "Couldn't connect", "timed out",
              "HTTP response code: 5", "Max retries exceeded")  # fmt: skip


_REACHED: set[int] = set()  # id() of the (cached, shared) filesystems that answered once


class StorageUnavailable(OSError):
    """The object store stayed unreachable (or kept answering "try again") past the retry bound."""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, FileNotFoundError | FileExistsError | PermissionError | IsADirectoryError):
        return False
    return isinstance(exc, ConnectionError | TimeoutError) or (
        isinstance(exc, OSError) and any(mark in str(exc) for mark in _TRANSIENT)
    )


def _retried(call: Callable[P, R]) -> Callable[P, R]:
    """A remote call asked again while the store is away, up to ``RETRY_SECONDS``. Every
    wrapped call is safe to repeat: a PUT replaces the whole object, a read or delete changes nothing
    more the second time."""

    @functools.wraps(call)
    def run(self: StorageLocation, *args: P.args, **kwargs: P.kwargs) -> R:
        bound = RETRY_SECONDS

        def outage(exc: BaseException) -> bool:
            return _transient(exc) and id(self.fs) in _REACHED

        retrying = Retrying(
            retry=retry_if_exception(outage),
            stop=stop_after_delay(bound),
            wait=wait_exponential(multiplier=0.1, max=3.0),
            before_sleep=lambda state: log.warning(
                "%s: %s failed (%s), attempt %d; retrying", self, call.__name__,
                _first_line(state.outcome.exception()), state.attempt_number,
            ),
            reraise=True,
        )  # fmt: skip
        try:
            for attempt in retrying:
                with attempt:
                    result = call(self, *args, **kwargs)
                    _REACHED.add(id(self.fs))
                    return result
        except OSError as exc:
            if not outage(exc):
                raise
            raise StorageUnavailable(
                f"{self}: {call.__name__} failed for {bound:.0f}s (the retry bound), the store is "
                f"unreachable: {_first_line(exc)}"
            ) from None
        raise AssertionError("unreachable: tenacity re-raises the last error")

    return run  # type: ignore[return-value]


def _first_line(exc: BaseException | None) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _replaced_under_reader(exc: BaseException) -> bool:
    """What fsspec's WebHDFS client raises when the file it opened was replaced or removed."""
    return isinstance(exc, FileNotFoundError) or "out of the range" in str(exc)


def _same_version(before: pafs.FileInfo, after: pafs.FileInfo) -> bool:
    return (after.type, after.size, after.mtime) == (before.type, before.size, before.mtime)


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
    @_retried
    def read_bytes(self) -> bytes:
        """The object's bytes; FileNotFoundError when it does not exist.

        On HDFS a file that ``put_atomic`` replaces while it is read (a registry heartbeat, a
        checkpoint's LATEST) is read again: the WebHDFS client sizes its reads at open, so a
        replacement of another length fails the read or cuts it short. S3 serves one GET whole."""
        import pyarrow.fs as pafs

        for _ in range(REREADS):
            before = self.fs.get_file_info(self.path)
            if before.type != pafs.FileType.File:
                raise FileNotFoundError(str(self))
            try:
                with self.fs.open_input_stream(self.path) as stream:
                    data = stream.read()
            except (RuntimeError, OSError) as exc:
                if self.scheme != "webhdfs" or not _replaced_under_reader(exc):
                    raise
                continue
            if self.scheme != "webhdfs" or _same_version(before, self.fs.get_file_info(self.path)):
                return data
        raise OSError(f"{self}: replaced while being read, {REREADS} times in a row")

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    @_retried
    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    @_retried
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
    @_retried
    def write_bytes(self, data: bytes) -> None:
        """Write the object (visible whole on S3 once the PUT completes; not atomic on HDFS)."""
        if self.scheme != "s3":  # S3 has no directories; HDFS wants the parent
            self.fs.create_dir(self.parent.path, recursive=True)
        with self.fs.open_output_stream(self.path) as stream:
            stream.write(data)

    def put_atomic(self, data: bytes) -> None:
        """Publish ``data`` whole or not at all: a commit point. S3: one PUT (an object is never
        seen half-written); HDFS: a temp file renamed over the target in one step, so a reader
        finds the old version or the new one, never neither."""
        if self.scheme == "s3":
            self.write_bytes(data)
            return
        tmp = self.parent / f".{self.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.write_bytes(data)
        try:
            if self.scheme == "webhdfs":
                self._rename_over(tmp, data)
            else:  # libhdfs' move does not overwrite
                if self.exists():
                    self.delete()
                self.fs.move(tmp.path, self.path)
        except BaseException:
            tmp.delete()
            raise

    @_retried
    def _rename_over(self, source: StorageLocation, data: bytes) -> None:
        """WebHDFS RENAME with ``renameoptions=OVERWRITE``: the NameNode's rename2, which replaces
        the target atomically (fsspec's ``mv`` has no such option, hence its raw call).

        Asked again after an outage, the source may be gone because the first rename landed and only
        its answer was lost: done when the target holds ``data``."""
        client = self.fs.handler.fs
        try:
            client._call("RENAME", method="put", path=source.path, destination=self.path, renameoptions="OVERWRITE")
        except FileNotFoundError:
            if source.exists() or not self.exists() or self.read_bytes() != data:
                raise

    @_retried
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


def locate(
    target: str | os.PathLike | StorageLocation, credentials: StorageCredentials | None = None
) -> StorageLocation | Path:
    """A StorageLocation for a remote URI (or location), else the local Path; ``credentials``: the
    store's (None: the process's default storage connection, else the SDK's defaults)."""
    if isinstance(target, StorageLocation):
        return target
    text = os.fspath(target)
    scheme = scheme_of(text)
    if scheme == "file":
        return Path(text[len("file://") :] if text.startswith("file://") else text).absolute()
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(f"{text}: unsupported storage scheme {scheme!r} (expected a local path, s3:// or webhdfs://)")
    from primus_lib.filesystems import resolve

    where = resolve(text, credentials)
    return StorageLocation(where.fs, where.path.rstrip("/") or "/", where.scheme, where.authority)


def unique_name(stem: str, suffix: str) -> str:
    """``stem-<nonce>suffix``: parts of one writer never collide with another's."""
    return f"{stem}-{uuid.uuid4().hex[:12]}{suffix}"


def unresolved(uri: str, error: Exception) -> StorageLocation:
    """A location of ``uri`` whose every filesystem call raises ``error`` (a connection that could
    not be resolved): paths and URIs can still be computed (a DAG parse, an annotation), and the
    error names the connection where the store is first used."""
    import pyarrow.fs as pafs

    where = uri.partition("://")[2]
    fs = pafs.PyFileSystem(_refusing(error))
    return StorageLocation(fs, where.rstrip("/") or "/", scheme_of(uri), where.split("/", 1)[0])


def _refusing(error: Exception):
    import pyarrow.fs as pafs

    def refuse(self, *args, **kwargs):
        raise type(error)(str(error))

    names = [n for n in dir(pafs.FileSystemHandler) if not n.startswith("_")]
    methods = {n: refuse for n in names if n != "get_type_name"}
    handler = type("Refusing", (pafs.FileSystemHandler,), {**methods, "get_type_name": lambda self: "unresolved"})
    handler.__eq__ = lambda self, other: self is other
    handler.__ne__ = lambda self, other: self is not other
    return handler()
