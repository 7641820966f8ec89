"""Object-storage settings (S3, HDFS/WebHDFS) from an Airflow connection: as typed credentials
(``primus_lib.filesystems.S3Credentials`` / ``WebHdfsCredentials``) a caller passes to the
filesystem factory, or as the env the data plane's processes read."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook

from primus_lib.filesystems import S3Credentials, StorageCredentials, WebHdfsCredentials, credentials_env

S3_TYPES = {"aws", "s3", "primus_s3"}
HDFS_TYPES = {"hdfs", "webhdfs", "primus_hdfs"}
WEBHDFS_TYPES = {"webhdfs", "primus_hdfs"}  # host/port: the NameNode's HTTP (WebHDFS) address


class PrimusStorageHook(BaseHook):
    """S3 (conn types ``aws``/``s3``): login/password = access/secret key, extra ``endpoint_url``,
    ``region_name``. HDFS/WebHDFS: login = user, extra ``kerberos_ticket_cache``. A ``webhdfs``
    connection's host/port (as for the Apache HDFS provider's WebHDFSHook; extra ``use_ssl``) is
    the NameNode that spec URIs without one (``webhdfs:///path``) read from; a comma-separated
    host list (HA NameNodes) is narrowed to the one that answers, with the provider's own probe.
    """

    conn_name_attr = "storage_conn_id"
    default_conn_name = "primus_storage_default"
    conn_type = "primus_s3"
    hook_name = "Primus object storage"

    def __init__(self, storage_conn_id: str = default_conn_name):
        super().__init__()
        self.storage_conn_id = storage_conn_id

    def env(self) -> dict[str, str]:
        conn = self.get_connection(self.storage_conn_id)
        host = conn.host
        if _ha(conn):
            host = active_namenode(self.storage_conn_id, conn.port)
        return storage_env(conn.conn_type or "", host, conn.port, conn.login, conn.password, conn.extra_dejson)

    async def acredentials(self) -> StorageCredentials:
        """The connection as credentials, read without blocking the event loop (the triggerer's
        way: ``aget_connection`` asks its supervisor; the HA NameNode probe runs in a thread)."""
        conn = await self.aget_connection(self.storage_conn_id)
        host = conn.host
        if _ha(conn):
            host = await asyncio.to_thread(active_namenode, self.storage_conn_id, conn.port)
        return storage_credentials(conn.conn_type or "", host, conn.port, conn.login, conn.password, conn.extra_dejson)


def _ha(conn: Any) -> bool:
    return (conn.conn_type or "") in WEBHDFS_TYPES and bool(conn.host) and "," in conn.host


def active_namenode(conn_id: str, port: int | None) -> str:
    """The first NameNode of a connection's HA host list whose WebHDFS answers (the provider's probe)."""
    if port is None:
        raise ValueError(f"connection {conn_id!r}: several NameNodes need the port of their HTTP (WebHDFS) server")
    from airflow.providers.apache.hdfs.hooks.webhdfs import WebHDFSHook

    client = WebHDFSHook(conn_id).get_conn()  # raises when no NameNode answers
    return urlsplit(client.url).hostname or ""


def storage_credentials(
    conn_type: str, host: str | None, port: int | None, login: str | None, password: str | None, extra: dict[str, Any]
) -> StorageCredentials:
    if conn_type in S3_TYPES:
        endpoint = extra.get("endpoint_url") or (f"{host}:{port}" if host and port else host)
        return S3Credentials(
            access_key_id=login or None,
            secret_access_key=(password or "") if login else None,
            endpoint_url=str(endpoint) if endpoint else None,
            region=str(extra["region_name"]) if extra.get("region_name") else None,
        )
    if conn_type in HDFS_TYPES:
        namenode = None
        if host and conn_type in WEBHDFS_TYPES:
            if "," in host:
                raise ValueError(f"connection host {host!r}: several NameNodes (PrimusStorageHook.env picks one)")
            use_ssl = str(extra.get("use_ssl", "")).lower() in ("true", "1", "yes")
            namenode = f"{'https' if use_ssl else 'http'}://{host}:{port or 9870}"
        return WebHdfsCredentials(user=login or None, namenode_url=namenode)
    raise ValueError(f"connection type {conn_type!r}: expected one of {sorted(S3_TYPES | HDFS_TYPES)}")


def storage_env(
    conn_type: str, host: str | None, port: int | None, login: str | None, password: str | None, extra: dict[str, Any]
) -> dict[str, str]:
    env = credentials_env(storage_credentials(conn_type, host, port, login, password, extra))
    if conn_type in HDFS_TYPES and extra.get("kerberos_ticket_cache"):
        env["KRB5CCNAME"] = str(extra["kerberos_ticket_cache"])  # libhdfs (hdfs://) reads it
    return env
