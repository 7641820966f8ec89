"""One filesystem interface for every batch storage: local files, S3, HDFS, WebHDFS.

URIs are resolved to a ``pyarrow.fs.FileSystem`` plus a path inside it, so listing and reading
code is the same for all of them. S3 settings come from the standard environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``)
or from URI query parameters (``?endpoint=host:port&scheme=http``); credentials never live in
the spec. ``webhdfs://host:port/path`` goes through fsspec's WebHDFS client (REST, no JVM);
``hdfs://`` through pyarrow's libhdfs binding (needs a Hadoop client install). Neither was run
against a real Hadoop cluster here: none is obtainable on this machine.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pyarrow.fs as pafs

_LOCK = threading.Lock()


@dataclass(frozen=True)
class Location:
    """A filesystem and a path inside it (no scheme; for S3 ``bucket/key``)."""

    fs: pafs.FileSystem
    path: str
    scheme: str
    authority: str

    def uri(self, path: str) -> str:
        """The URI of ``path`` on this filesystem, for task records and error messages."""
        if self.scheme == "file":
            return "file://" + path
        if self.scheme == "s3":
            return "s3://" + path
        return f"{self.scheme}://{self.authority}{path if path.startswith('/') else '/' + path}"


def resolve(uri: str) -> Location:
    """Split ``uri`` into a (cached, shared) filesystem and a path."""
    parts = urlsplit(uri)
    scheme = parts.scheme or "file"
    query = tuple(sorted((k, v[-1]) for k, v in parse_qs(parts.query).items()))
    if scheme == "file":
        return Location(
            _local(), os.path.abspath(parts.netloc + parts.path) + ("/" if uri.endswith("/") else ""), "file", ""
        )
    if scheme == "s3":
        path = parts.netloc + parts.path
        return Location(_s3(query, _s3_env_key()), path, "s3", parts.netloc)
    if scheme == "webhdfs":
        return Location(
            _webhdfs(parts.hostname or "localhost", parts.port or 9870, query), parts.path, scheme, parts.netloc
        )
    if scheme == "hdfs":
        return Location(_hdfs(parts.hostname or "default", parts.port or 8020), parts.path, scheme, parts.netloc)
    raise ValueError(f"{uri}: unsupported scheme {scheme!r} (expected file://, s3://, webhdfs:// or hdfs://)")


@functools.cache
def _local() -> pafs.FileSystem:
    return pafs.LocalFileSystem()


def _s3_env_key() -> tuple:
    names = (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    )
    return tuple(os.environ.get(n) for n in names)


@functools.lru_cache(maxsize=16)
def _s3(query: tuple, env: tuple) -> pafs.FileSystem:
    options = dict(query)
    access, secret, region, endpoint, endpoint_s3 = env
    endpoint = options.get("endpoint") or endpoint_s3 or endpoint
    kwargs: dict = {"region": options.get("region") or region or "us-east-1"}
    if access and secret:
        kwargs.update(access_key=access, secret_key=secret)
    if endpoint:
        split = urlsplit(endpoint if "://" in endpoint else f"{options.get('scheme', 'https')}://{endpoint}")
        kwargs.update(endpoint_override=split.netloc, scheme=split.scheme)
    return pafs.S3FileSystem(**kwargs)


@functools.lru_cache(maxsize=16)
def _webhdfs(host: str, port: int, query: tuple) -> pafs.FileSystem:
    from fsspec.implementations.webhdfs import WebHDFS

    options = dict(query)
    user = options.get("user") or os.environ.get("HADOOP_USER_NAME")
    client = WebHDFS(host, port=port, user=user, use_https=options.get("https") == "true")
    return pafs.PyFileSystem(_StrictHandler(client))


class _StrictHandler(pafs.FSSpecHandler):
    """fsspec's handler turns every error of a directory probe into "not found"; an unreachable
    NameNode must not look like a missing partition, so probe with ``info`` first."""

    def get_file_info_selector(self, selector):
        try:
            self.fs.info(selector.base_dir)
        except FileNotFoundError:
            if selector.allow_not_found:
                return []
            raise
        return super().get_file_info_selector(selector)


@functools.lru_cache(maxsize=16)
def _hdfs(host: str, port: int) -> pafs.FileSystem:
    return pafs.HadoopFileSystem(host, port)


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name
