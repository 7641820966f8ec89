"""Object-storage settings (S3, HDFS/WebHDFS) from an Airflow connection, as the env the data plane reads."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook

S3_TYPES = {"aws", "s3", "primus_s3"}
HDFS_TYPES = {"hdfs", "webhdfs", "primus_hdfs"}
WEBHDFS_TYPES = {"webhdfs", "primus_hdfs"}  # host/port: the NameNode's HTTP (WebHDFS) address
WEBHDFS_URL_ENV = "PRIMUS_WEBHDFS_URL"  # read by primus_lib.filesystems for webhdfs:///path


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
        if (conn.conn_type or "") in WEBHDFS_TYPES and host and "," in host:
            host = active_namenode(self.storage_conn_id, conn.port)
        return storage_env(conn.conn_type or "", host, conn.port, conn.login, conn.password, conn.extra_dejson)


def active_namenode(conn_id: str, port: int | None) -> str:
    """The first NameNode of a connection's HA host list whose WebHDFS answers (the provider's probe)."""
    if port is None:
        raise ValueError(f"connection {conn_id!r}: several NameNodes need the port of their HTTP (WebHDFS) server")
    from airflow.providers.apache.hdfs.hooks.webhdfs import WebHDFSHook

    client = WebHDFSHook(conn_id).get_conn()  # raises when no NameNode answers
    return urlsplit(client.url).hostname or ""


def storage_env(
    conn_type: str, host: str | None, port: int | None, login: str | None, password: str | None, extra: dict[str, Any]
) -> dict[str, str]:
    env: dict[str, str] = {}
    if conn_type in S3_TYPES:
        if login:
            env["AWS_ACCESS_KEY_ID"] = login
            env["AWS_SECRET_ACCESS_KEY"] = password or ""
        endpoint = extra.get("endpoint_url") or (f"{host}:{port}" if host and port else host)
        if endpoint:
            env["AWS_ENDPOINT_URL_S3"] = str(endpoint)
        region = extra.get("region_name")
        if region:
            env["AWS_DEFAULT_REGION"] = str(region)
    elif conn_type in HDFS_TYPES:
        if login:
            env["HADOOP_USER_NAME"] = login
        if host and conn_type in WEBHDFS_TYPES:
            if "," in host:
                raise ValueError(f"connection host {host!r}: several NameNodes (PrimusStorageHook.env picks one)")
            use_ssl = str(extra.get("use_ssl", "")).lower() in ("true", "1", "yes")
            env[WEBHDFS_URL_ENV] = f"{'https' if use_ssl else 'http'}://{host}:{port or 9870}"
        if extra.get("kerberos_ticket_cache"):
            env["KRB5CCNAME"] = str(extra["kerberos_ticket_cache"])
    else:
        raise ValueError(f"connection type {conn_type!r}: expected one of {sorted(S3_TYPES | HDFS_TYPES)}")
    return env
