"""Partition listings over WebHDFS: one LISTSTATUS per wanted directory, pipelined on kept-alive
connections; the client both planners use on WebHDFS (the naive one through
``FusedLister.list_dir``/``is_file``, one request at a time).

WebHDFS has no recursive listing (every op reads one path), so the fewest requests a planner
can make is one per partition directory; a recursive walk of the common parent costs more
(every intermediate directory). DTGG lists each wanted directory once and takes its success
marker from that listing; the naive planner asks for the marker (GETFILESTATUS), then lists.
The requests of a connection are HTTP/1.1-pipelined (``PIPELINE`` sent before their answers
are read, answers come back in order): one round trip per batch instead of per directory. The
server still answers them one after another, so its per-request time is not hidden: only the
planner's threads, each pipelining its own share on its own connection, overlap it.
"""

from __future__ import annotations

import json
import socket
import threading
from urllib.parse import quote, urlencode, urlsplit

import pyarrow.fs as pafs

from primus_lib.data.dtgg.listing import FileEntry

__all__ = ["WebHdfsLister", "webhdfs_client"]

PIPELINE = 32  # requests in flight on one connection (~5 KB of request lines)


def webhdfs_client(fs: pafs.FileSystem):
    """The fsspec WebHDFS client behind ``fs`` (primus_lib.filesystems wraps one), else None."""
    inner = getattr(getattr(fs, "handler", None), "fs", None)
    if inner is None or type(inner).__name__ != "WebHDFS":
        return None
    return inner


class _Closed(Exception):
    """The server closed the connection before answering every pipelined request."""


class ListingRefused(OSError):
    """The NameNode answered a request with an error other than "not found"."""


class WebHdfsLister:
    """Lists single directories of one NameNode; thread-safe (a connection per thread)."""

    def __init__(self, client, timeout: float = 30.0):
        self.client = client
        split = urlsplit(client.url)  # http[s]://host:port/webhdfs/v1
        self.https = split.scheme == "https"
        self.host, self.port, self.base = split.hostname, split.port, split.path.rstrip("/")
        self.pars = dict(client.pars)  # user.name / delegation / doas
        # Kerberos, basic auth or client certificates: let fsspec's requests session do the call.
        self.raw = not (
            client.kerb or getattr(client, "password", None) or getattr(client, "session_cert", None) or self.https
        )
        self.timeout = timeout
        self._local = threading.local()

    def list_dir(self, directory: str) -> list[FileEntry] | None:
        """The files (not subdirectories) of ``directory``; None when it does not exist."""
        return self.list_dirs([directory])[directory]

    def list_dirs(self, directories: list[str]) -> dict[str, list[FileEntry] | None]:
        """The files of each directory (None for one that does not exist), on this thread's connection."""
        out: dict[str, list[FileEntry] | None] = {}
        for i in range(0, len(directories), PIPELINE):
            batch = directories[i : i + PIPELINE]
            for directory, answer in zip(batch, self._exchange("LISTSTATUS", batch), strict=True):
                out[directory] = None if answer is None else _files(answer["FileStatuses"]["FileStatus"])
        return out

    def is_file(self, path: str) -> bool:
        """Whether ``path`` is a file: one GETFILESTATUS."""
        answer = self._exchange("GETFILESTATUS", [path])[0]
        return answer is not None and answer["FileStatus"].get("type") == "FILE"

    def _exchange(self, op: str, paths: list[str]) -> list[dict | None]:
        """The JSON answer to ``op`` on each path (None: not found), pipelined on this thread's connection."""
        if not self.raw:
            return [self._fsspec_call(op, p.rstrip("/") or "/") for p in paths]
        out: dict[str, dict | None] = {}
        self._pipelined(op, list(dict.fromkeys(paths)), out)
        return [out[p] for p in paths]

    def _fsspec_call(self, op: str, path: str) -> dict | None:
        try:
            return self.client._call(op, path=path).json()
        except FileNotFoundError:
            return None

    def _pipelined(self, op: str, batch: list[str], out: dict) -> None:
        """Send the batch's requests at once, read the answers in order; on a closed connection
        resend what is unanswered on a new one (a request that made no progress twice fails)."""
        pending = list(batch)
        stalls = 0
        query = urlencode({"op": op, **self.pars})
        while pending:
            try:
                sock, reader = self._connection()
                sock.sendall(b"".join(self._request(p, query) for p in pending))
                while pending:
                    status, body, close = _response(reader)
                    out[pending[0]] = self._answer(op, pending[0], status, body)
                    pending.pop(0)  # answered: a retry starts after it
                    stalls = 0
                    if close:
                        raise _Closed
            except ListingRefused:
                self._drop()  # unread answers of the batch are still on the connection
                raise
            except (_Closed, OSError, ValueError) as exc:
                self._drop()
                stalls += 1
                if pending and (stalls > 1 or not isinstance(exc, _Closed | ConnectionError | ValueError)):
                    why = "connection closed" if isinstance(exc, _Closed) else exc
                    raise OSError(f"webhdfs://{self.host}:{self.port}{pending[0]}: {op} failed: {why}") from exc

    def _request(self, path: str, query: str) -> bytes:
        quoted = quote(path.rstrip("/") or "/")
        return f"GET {self.base}{quoted}?{query} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode()

    def _answer(self, op: str, path: str, status: int, body: bytes) -> dict | None:
        if status == 404:
            return None
        if status != 200:
            raise ListingRefused(f"webhdfs://{self.host}:{self.port}{path}: {op} answered {status}: {body[:200]!r}")
        return json.loads(body)

    def _connection(self):
        found = getattr(self._local, "conn", None)
        if found is None:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            found = self._local.conn = (sock, sock.makefile("rb", buffering=1 << 16))
        return found

    def _drop(self) -> None:
        found = getattr(self._local, "conn", None)
        self._local.conn = None
        if found is not None:
            found[1].close()
            found[0].close()


def _files(statuses: list[dict] | None) -> list[FileEntry] | None:
    if statuses is None:
        return None
    return [FileEntry(s["pathSuffix"], int(s.get("length") or 0)) for s in statuses if s.get("type") == "FILE"]


def _response(reader) -> tuple[int, bytes, bool]:
    """(status, body, whether the server closes the connection) of the next HTTP/1.1 answer."""
    line = reader.readline(65537)
    if not line:
        raise _Closed
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP status line: {line[:80]!r}")
    status = int(parts[1])
    length, chunked, close = None, False, parts[0] == b"HTTP/1.0"
    while (header := reader.readline(65537)) not in (b"\r\n", b"\n", b""):
        name, _, value = header.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.endswith(b"chunked")
        elif name == b"connection":
            close = value == b"close"
    if chunked:
        body = bytearray()
        while size := int(reader.readline(65537).split(b";", 1)[0], 16):
            body += reader.read(size)
            reader.readline(65537)
        while reader.readline(65537) not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return status, bytes(body), close
    if length is None:  # the body runs to the end of the connection
        return status, reader.read(), True
    body = reader.read(length)
    if len(body) < length:
        raise _Closed
    return status, body, close
