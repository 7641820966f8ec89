"""One filesystem interface for every batch storage: local files, S3, HDFS, WebHDFS.

URIs are resolved to a ``pyarrow.fs.FileSystem`` plus a path inside it, so listing and reading
code is the same for all of them. Credentials are passed in (``S3Credentials`` /
``WebHdfsCredentials``, resolved from a connection id by ``primus_lib.credentials``); nothing here
reads the environment. Without them a URI uses the process's default storage connection
(``primus_storage_default``, when there is one of the URI's kind), else the SDK's defaults; URI
query parameters (``?endpoint=host:port&scheme=http``, ``?user=``) override.

``webhdfs://host:port/path`` goes through fsspec's WebHDFS client (REST, no JVM; tested against
a real NameNode, Hadoop's MiniDFSCluster). A URI without a NameNode (``webhdfs:///path``) uses
the connection's (``WebHdfsCredentials.namenode_url``), else ``localhost:9870``.
``hdfs://`` goes through pyarrow's libhdfs binding, which needs a JVM and Hadoop's native
libhdfs (only in Hadoop's binary distribution): not obtainable on the project's machines, so
untested here.

One process can serve sources of several accounts (the Airflow triggerer): filesystems are
cached per credentials.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

import pyarrow.fs as pafs

from primus_lib.credentials import S3Credentials, StorageCredentials, WebHdfsCredentials, current

__all__ = ["Location", "S3Credentials", "StorageCredentials", "WebHdfsCredentials", "join", "resolve"]
WEBHDFS_DEFAULT_PORT = 9870
_Kind = TypeVar("_Kind", S3Credentials, WebHdfsCredentials)


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


def resolve(uri: str, credentials: StorageCredentials | None = None) -> Location:
    """Split ``uri`` into a (cached, shared) filesystem and a path, using ``credentials`` (None:
    the process's default storage connection of the URI's kind, else the SDK's defaults)."""
    parts = urlsplit(uri)
    scheme = parts.scheme or "file"
    if credentials is None and scheme in ("s3", "webhdfs"):
        credentials = current().storage(None, uri=uri)
    query = tuple(sorted((k, v[-1]) for k, v in parse_qs(parts.query).items()))
    if scheme == "file":
        return Location(
            _local(), os.path.abspath(parts.netloc + parts.path) + ("/" if uri.endswith("/") else ""), "file", ""
        )
    if scheme == "s3":
        path = parts.netloc + parts.path
        return Location(_s3(query, _s3_key(uri, credentials)), path, "s3", parts.netloc)
    if scheme == "webhdfs":
        given = _expect(uri, credentials, WebHdfsCredentials)
        host, port, https = _namenode(parts, given.namenode_url if given else None)
        options = dict(query)
        user = options.get("user") or (given.user if given else None)
        https = https or options.get("https") == "true"
        # Tasks carry the NameNode even when the spec's URI left it to the connection.
        authority = parts.netloc or f"{host}:{port}"
        return Location(_webhdfs(host, port, user, https), parts.path or "/", scheme, authority)
    if scheme == "hdfs":
        return Location(_hdfs(parts.hostname or "default", parts.port or 8020), parts.path, scheme, parts.netloc)
    raise ValueError(f"{uri}: unsupported scheme {scheme!r} (expected file://, s3://, webhdfs:// or hdfs://)")


@functools.cache
def _local() -> pafs.FileSystem:
    return pafs.LocalFileSystem()


def _expect(uri: str, credentials: StorageCredentials | None, kind: type[_Kind]) -> _Kind | None:
    if credentials is None or isinstance(credentials, kind):
        return credentials
    raise ValueError(f"{uri}: the connection's credentials are {type(credentials).__name__}, expected {kind.__name__}")


def _s3_key(uri: str, credentials: StorageCredentials | None) -> tuple:
    """(access key, secret key, region, endpoint) of the credentials (all None without)."""
    given = _expect(uri, credentials, S3Credentials)
    if given is None:
        return None, None, None, None
    return given.access_key_id, given.secret_access_key, given.region, given.endpoint_url


@functools.lru_cache(maxsize=16)
def _s3(query: tuple, env: tuple) -> pafs.FileSystem:
    options = dict(query)
    access, secret, region, endpoint = env
    endpoint = options.get("endpoint") or endpoint
    # allow_delayed_open: an object smaller than a multipart part goes up in one PUT at close (a
    # multipart upload is three requests: a committed window's 17 objects took 51); an error then
    # comes at close, which every write here reaches before it returns
    kwargs: dict = {"region": options.get("region") or region or "us-east-1", "allow_delayed_open": True}
    if access and secret:
        kwargs.update(access_key=access, secret_key=secret)
    if endpoint:
        split = urlsplit(endpoint if "://" in endpoint else f"{options.get('scheme', 'https')}://{endpoint}")
        kwargs.update(endpoint_override=split.netloc, scheme=split.scheme)
    return pafs.S3FileSystem(**kwargs)


def _namenode(parts, default: str | None) -> tuple[str, int, bool]:
    """(host, HTTP port, https) of a webhdfs URI, from the URI or else ``default`` (the
    connection's NameNode)."""
    if parts.hostname:
        return parts.hostname, parts.port or WEBHDFS_DEFAULT_PORT, False
    if not default:
        return "localhost", WEBHDFS_DEFAULT_PORT, False
    split = urlsplit(default if "://" in default else f"http://{default}")
    if not split.hostname:
        raise ValueError(f"NameNode {default!r} (of the connection): expected http[s]://host:port")
    return split.hostname, split.port or WEBHDFS_DEFAULT_PORT, split.scheme == "https"


@functools.lru_cache(maxsize=16)
def _webhdfs(host: str, port: int, user: str | None, https: bool) -> pafs.FileSystem:
    from fsspec.implementations.webhdfs import WebHDFS

    client = WebHDFS(host, port=port, user=user, use_https=https)
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
    try:
        return pafs.HadoopFileSystem(host, port)
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OSError(
            f"hdfs://{host}:{port}: pyarrow's HDFS client needs a JVM (JAVA_HOME), Hadoop's native libhdfs "
            f"(ARROW_LIBHDFS_DIR or HADOOP_HOME/lib/native) and CLASSPATH=$(hadoop classpath --glob) ({first}); "
            "without a Hadoop install read the same cluster over REST: webhdfs://NAMENODE:HTTP_PORT/path"
        ) from exc


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name
