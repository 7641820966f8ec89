"""One path from a connection id to typed credentials, handed to the storage, Kafka and database factories.

A spec names connections (``spec.storage.connection_id``, a source's ``connection_id``, a Kafka
source's ``kafka.connection_id``, ``spec.storage.database_connection_id``), never secrets. A
``Resolver`` turns an id into typed credentials (``S3Credentials``, ``WebHdfsCredentials``, Kafka
client settings, a database login) from a ``ConnectionSource``:

- in a role process (trainer, executors, the CLI): ``SecretFiles``, a mounted secret: one
  ``<connection_id>.json`` per connection (Airflow's connection JSON: ``conn_type``, ``host``,
  ``port``, ``login``, ``password``, ``schema``, ``extra``) under ``$PRIMUS_SECRETS_DIR``;
- in Airflow: the plugin's connection source (``primus_operators.hooks.connections``), installed
  with ``using(...)`` around a task's work (a context variable: one task, thread or request sees
  its own; nothing is written to ``os.environ``).

A URI whose spec names no connection is read with the connection ``primus_storage_default`` when
the source has one of the URI's kind, else with the SDK's own defaults (pod identity, instance
profile).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from primus_lib.settings import settings

DEFAULT_STORAGE_CONNECTION = "primus_storage_default"  # the Airflow hook's default_conn_name too
S3_TYPES = frozenset({"aws", "s3", "primus_s3"})
HDFS_TYPES = frozenset({"hdfs", "webhdfs", "primus_hdfs"})
WEBHDFS_TYPES = frozenset({"webhdfs", "primus_hdfs"})  # host/port: the NameNode's HTTP (WebHDFS) address
CONNECTION_ID = re.compile(r"[A-Za-z0-9_.-]{1,250}")


class CredentialsError(ValueError):
    """A connection that cannot be found or used; the message names it, never its secret."""


class LoginRefused(Exception):
    """A server refused the login a connection holds (a wrong password, an unknown user)."""


@dataclass(frozen=True)
class S3Credentials:
    """An S3 store's keys, endpoint and region. None fields are unset (no keys: the SDK's default
    chain; no endpoint: AWS itself)."""

    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None  # http[s]://host:port
    region: str | None = None


@dataclass(frozen=True)
class WebHdfsCredentials:
    """The WebHDFS user and the NameNode of ``webhdfs:///path`` URIs (``http[s]://host:port``)."""

    user: str | None = None
    namenode_url: str | None = None


StorageCredentials = S3Credentials | WebHdfsCredentials


@dataclass(frozen=True)
class HttpLogin:
    """An HTTP API's address and login, from an HTTP connection as Airflow's HttpHook reads one (the
    host, with its scheme or ``schema``, and port; ``login``/``password``: basic auth; ``extra.token``:
    a bearer token)."""

    url: str | None = None
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Connection:
    """One connection as Airflow stores it; ``password`` and ``extra`` stay out of reprs (logs)."""

    conn_id: str
    conn_type: str = ""
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    schema: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def as_json(self) -> str:
        keys = ("conn_type", "host", "port", "login", "password", "schema")
        body = {k: getattr(self, k) for k in keys if getattr(self, k) not in (None, "")}
        return json.dumps({**body, "extra": dict(self.extra)} if self.extra else body, sort_keys=True)


def parse_connection(conn_id: str, text: str, where: str) -> Connection:
    """Airflow's connection JSON (what ``airflow connections export --format json`` writes per id)."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CredentialsError(f"{where}: expected a JSON connection object, not valid JSON ({exc.msg})") from None
    if not isinstance(body, dict):
        raise CredentialsError(f"{where}: expected a JSON connection object, found {type(body).__name__}")
    extra = body.get("extra") or {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra) if extra.strip() else {}
        except json.JSONDecodeError:
            raise CredentialsError(f"{where}: extra: expected a JSON object") from None
    port = body.get("port")
    if port not in (None, "") and not str(port).isdigit():
        raise CredentialsError(f"{where}: port: expected a number, found {port!r}")
    return Connection(
        conn_id,
        str(body.get("conn_type") or ""),
        body.get("host") or None,
        int(port) if port else None,
        body.get("login") or None,
        body.get("password") or None,
        body.get("schema") or None,
        dict(extra),
    )


class ConnectionSource(Protocol):
    def connection(self, conn_id: str) -> Connection | None:
        """The connection, or None when this source has none of that id."""


class SecretFiles:
    """A mounted secret: ``<directory>/<conn_id>.json`` (a Kubernetes Secret volume, a 0600 file)."""

    def __init__(self, directory: Path | str | None):
        self.directory = Path(directory) if directory else None

    def connection(self, conn_id: str) -> Connection | None:
        if self.directory is None:
            return None
        path = self.directory / f"{_checked_id(conn_id)}.json"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialsError(f"{path}: cannot read the connection secret: {exc}") from None
        return parse_connection(conn_id, text, str(path))


def _checked_id(conn_id: str) -> str:
    if not CONNECTION_ID.fullmatch(conn_id):
        raise CredentialsError(f"connection id {conn_id!r}: expected letters, digits, '_', '-' or '.'")
    return conn_id


def write_secret_files(directory: Path, connections: Iterable[Connection]) -> Path:
    """Write ``connections`` as ``<id>.json`` files (mode 0600, each replaced atomically) under
    ``directory`` (made 0700): the mounted secret of roles started on this host."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    for conn in connections:
        fd, tmp = tempfile.mkstemp(prefix=".conn-", dir=directory)  # 0600
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(conn.as_json())
        os.replace(tmp, directory / f"{_checked_id(conn.conn_id)}.json")
    return directory


def mount(resolver: Resolver, conn_ids: Iterable[str], directory: Path) -> dict[str, str]:
    """The connections ``conn_ids`` (and the default storage one) as ``resolver`` finds them, written
    as secret files under ``directory`` for a child process on this host: the child's environment
    ({} when there is nothing to mount: the child inherits this process's own secrets)."""
    found = resolver.mountable(conn_ids)
    return {"PRIMUS_SECRETS_DIR": str(write_secret_files(directory, found))} if found else {}


def private_directory(owner: str) -> Path:
    """A fresh 0700 directory for a child's secret files, never inside a job's state (which other
    readers, copies and backups see): in memory under /dev/shm as a Kubernetes Secret volume is,
    else under the temp folder. Whoever made it removes it when its children are gone."""
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None
    return Path(tempfile.mkdtemp(prefix=f"primus-secrets-{re.sub(r'[^A-Za-z0-9_.-]', '-', owner)}-", dir=parent))


class Resolver:
    """Connection id -> typed credentials, from one source (secret files, Airflow's connections)."""

    def __init__(self, source: ConnectionSource):
        self.source = source

    def connection(self, conn_id: str, where: str = "connection") -> Connection:
        found = self.source.connection(conn_id)
        if found is None:
            raise CredentialsError(f"{where} {conn_id!r}: not found ({_describe(self.source)})")
        return found

    def storage(self, conn_id: str | None, where: str = "connection", uri: str = "") -> StorageCredentials | None:
        """The named connection's storage credentials; no name: the default connection of the
        kind of ``uri`` (s3://, webhdfs://) when there is one, else None (the SDK's defaults)."""
        if conn_id:
            return storage_credentials(self.connection(conn_id, where))
        scheme = uri.partition("://")[0].lower() if "://" in uri else "file"
        default = self.source.connection(DEFAULT_STORAGE_CONNECTION) if scheme in ("s3", "webhdfs") else None
        if default is None or default.conn_type not in (S3_TYPES if scheme == "s3" else HDFS_TYPES):
            return None
        return storage_credentials(default)

    def kafka(self, conn_id: str | None, where: str = "kafka.connection_id") -> dict[str, str]:
        return kafka_config(self.connection(conn_id, where)) if conn_id else {}

    def http(self, conn_id: str, where: str = "connection") -> HttpLogin:
        return http_login(self.connection(conn_id, where))

    def mountable(self, conn_ids: Iterable[str]) -> list[Connection]:
        """The named connections this source has, and the default storage connection when it has
        one: what a role started on this host gets as its secret files."""
        wanted = dict.fromkeys([*conn_ids, DEFAULT_STORAGE_CONNECTION])
        return [conn for conn in (self.source.connection(c) for c in wanted) if conn is not None]

    def login(self, conn_id: str | None, where: str = "connection") -> tuple[str | None, str | None]:
        """(login, password) of a connection; (None, None) when none is named or found."""
        found = self.source.connection(conn_id) if conn_id else None
        return (found.login, found.password) if found else (None, None)


def _describe(source: ConnectionSource) -> str:
    if isinstance(source, SecretFiles):
        if source.directory is None:
            return "no secrets directory: $PRIMUS_SECRETS_DIR is unset"
        return f"no {source.directory}/<id>.json"
    return type(source).__name__


_CURRENT: contextvars.ContextVar[Resolver | None] = contextvars.ContextVar("primus_resolver", default=None)


def current() -> Resolver:
    """The resolver installed by ``using``, else the secret files under ``$PRIMUS_SECRETS_DIR``."""
    found = _CURRENT.get()
    return found if found is not None else Resolver(SecretFiles(settings().secrets_dir))


@contextlib.contextmanager
def using(resolver: Resolver) -> Iterator[Resolver]:
    """Resolve connections with ``resolver`` in this context (a task, a thread, a request)."""
    token = _CURRENT.set(resolver)
    try:
        yield resolver
    finally:
        _CURRENT.reset(token)


# -- connection fields -> typed credentials ----------------------------------------------------
def storage_credentials(conn: Connection) -> StorageCredentials:
    """S3 (``aws``/``s3``): login/password = access/secret key, extra ``endpoint_url``, ``region_name``.
    HDFS/WebHDFS: login = user; a ``webhdfs`` connection's host/port (extra ``use_ssl``) is the
    NameNode of URIs without one (``webhdfs:///path``)."""
    extra, host, port = conn.extra, conn.host, conn.port
    if conn.conn_type in S3_TYPES:
        endpoint = extra.get("endpoint_url") or (f"{host}:{port}" if host and port else host)
        return S3Credentials(
            access_key_id=conn.login or None,
            secret_access_key=(conn.password or "") if conn.login else None,
            endpoint_url=str(endpoint) if endpoint else None,
            region=str(extra["region_name"]) if extra.get("region_name") else None,
        )
    if conn.conn_type in HDFS_TYPES:
        namenode = None
        if host and conn.conn_type in WEBHDFS_TYPES:
            if "," in host:
                raise CredentialsError(
                    f"connection {conn.conn_id!r}: host {host!r} lists several NameNodes (name the active one)"
                )
            use_ssl = str(extra.get("use_ssl", "")).lower() in ("true", "1", "yes")
            namenode = f"{'https' if use_ssl else 'http'}://{host}:{port or 9870}"
        return WebHdfsCredentials(user=conn.login or None, namenode_url=namenode)
    raise CredentialsError(
        f"connection {conn.conn_id!r}: type {conn.conn_type!r}, expected one of {sorted(S3_TYPES | HDFS_TYPES)}"
    )


def http_login(conn: Connection) -> HttpLogin:
    """``host`` (``https://h`` or ``h`` with ``schema`` https, else http) and ``port``; the login."""
    url = None
    if conn.host:
        url = conn.host.rstrip("/")
        if "://" not in url:
            url = f"{conn.schema if conn.schema in ('http', 'https') else 'http'}://{url}"
        if conn.port and urlsplit(url).port is None:
            url = f"{url}:{conn.port}"
    token = conn.extra.get("token")
    return HttpLogin(url, conn.login or None, conn.password if conn.login else None, str(token) if token else None)


def kafka_config(conn: Connection) -> dict[str, str]:
    """librdkafka settings: ``host[:port]`` (comma-separated hosts allowed) -> bootstrap.servers;
    login/password -> SASL; extra ``security_protocol``, ``sasl_mechanism``, ``config`` (raw settings)."""
    config: dict[str, str] = {}
    host, port, extra = conn.host, conn.port, conn.extra
    if host:
        config["bootstrap.servers"] = f"{host}:{port}" if port and "," not in host and ":" not in host else host
    if extra.get("security_protocol"):
        config["security.protocol"] = str(extra["security_protocol"])
    if conn.login:
        config["sasl.username"] = conn.login
        config["sasl.password"] = conn.password or ""
        config.setdefault("sasl.mechanism", str(extra.get("sasl_mechanism", "PLAIN")))
        config.setdefault("security.protocol", "SASL_SSL")
    config.update({str(k): str(v) for k, v in (extra.get("config") or {}).items()})
    return config
