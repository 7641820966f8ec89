"""Partition listings over WebHDFS: one LISTSTATUS per wanted directory, on kept-alive connections.

WebHDFS has no recursive listing (every op reads one path), so the fewest requests a planner
can make is one per partition directory; a recursive walk of the common parent costs more
(every intermediate directory, through fsspec's per-call overhead). The naive planner pays
three calls per partition (the marker's status, a probe, the listing). Here each wanted
directory is listed once, its success marker comes out of that listing, and the listings run
on a bounded thread pool, each thread on its own persistent HTTP connection.
"""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import quote, urlencode, urlsplit

import pyarrow.fs as pafs

from primus_lib.data.dtgg.listing import FileEntry

__all__ = ["WebHdfsLister", "webhdfs_client"]


def webhdfs_client(fs: pafs.FileSystem):
    """The fsspec WebHDFS client behind ``fs`` (primus_lib.filesystems wraps one), else None."""
    inner = getattr(getattr(fs, "handler", None), "fs", None)
    if inner is None or type(inner).__name__ != "WebHDFS":
        return None
    return inner


class WebHdfsLister:
    """Lists single directories of one NameNode; thread-safe (a connection per thread)."""

    def __init__(self, client, timeout: float = 30.0):
        self.client = client
        split = urlsplit(client.url)  # http[s]://host:port/webhdfs/v1
        self.https = split.scheme == "https"
        self.host, self.port, self.base = split.hostname, split.port, split.path.rstrip("/")
        self.query = dict(client.pars)  # user.name / delegation / doas
        # Kerberos, basic auth or client certificates: let fsspec's requests session do the call.
        self.raw = not (
            client.kerb or getattr(client, "password", None) or getattr(client, "session_cert", None) or self.https
        )
        self.timeout = timeout
        self._local = threading.local()

    def list_dir(self, directory: str) -> list[FileEntry] | None:
        """The files (not subdirectories) of ``directory``; None when it does not exist."""
        statuses = self._liststatus(directory.rstrip("/") or "/")
        if statuses is None:
            return None
        return [FileEntry(s["pathSuffix"], int(s.get("length") or 0)) for s in statuses if s.get("type") == "FILE"]

    def _liststatus(self, path: str) -> list[dict] | None:
        if not self.raw:
            try:
                answer = self.client._call("LISTSTATUS", path=path)
            except FileNotFoundError:
                return None
            return answer.json()["FileStatuses"]["FileStatus"]
        target = f"{self.base}{quote(path)}?{urlencode({'op': 'LISTSTATUS', **self.query})}"
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            conn = self._connection()
            try:
                conn.request("GET", target)
                response = conn.getresponse()
                body = response.read()
            except (http.client.HTTPException, OSError) as exc:
                conn.close()
                self._local.conn = None
                if attempt or not isinstance(exc, http.client.HTTPException | ConnectionResetError | BrokenPipeError):
                    raise OSError(f"webhdfs://{self.host}:{self.port}{path}: LISTSTATUS failed: {exc}") from exc
                continue
            break
        if response.status == 404:
            return None
        if response.status != 200:
            raise OSError(
                f"webhdfs://{self.host}:{self.port}{path}: LISTSTATUS answered {response.status}: {body[:200]!r}"
            )
        return json.loads(body)["FileStatuses"]["FileStatus"]

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn
