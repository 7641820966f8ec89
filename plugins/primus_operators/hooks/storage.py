"""Object-storage credentials (S3, HDFS/WebHDFS) of an Airflow connection, typed
(``primus_lib.credentials.S3Credentials`` / ``WebHdfsCredentials``) for the filesystem factory."""

from __future__ import annotations

from urllib.parse import urlsplit

from airflow.sdk import BaseHook

from primus_lib.credentials import WEBHDFS_TYPES as WEBHDFS_TYPES
from primus_lib.credentials import StorageCredentials, storage_credentials


class PrimusStorageHook(BaseHook):
    """S3 (conn types ``aws``/``s3``): login/password = access/secret key, extra ``endpoint_url``,
    ``region_name``. HDFS/WebHDFS: login = user. A ``webhdfs`` connection's host/port (as for the
    Apache HDFS provider's WebHDFSHook; extra ``use_ssl``) is the NameNode that spec URIs without
    one (``webhdfs:///path``) read from; a comma-separated host list (HA NameNodes) is narrowed to
    the one that answers, with the provider's own probe.
    """

    conn_name_attr = "storage_conn_id"
    default_conn_name = "primus_storage_default"
    conn_type = "primus_s3"
    hook_name = "Primus object storage"

    def __init__(self, storage_conn_id: str = default_conn_name):
        super().__init__()
        self.storage_conn_id = storage_conn_id

    def credentials(self) -> StorageCredentials:
        from primus_operators.hooks.connections import AirflowConnections

        return storage_credentials(AirflowConnections().connection(self.storage_conn_id) or self._missing())

    async def acredentials(self) -> StorageCredentials:
        """The connection as credentials, read without blocking the event loop (the triggerer's
        way: ``aget_connection`` asks its supervisor; the HA NameNode probe runs in a thread)."""
        from primus_operators.hooks.connections import AirflowConnections

        return storage_credentials(await AirflowConnections().aconnection(self.storage_conn_id) or self._missing())

    def _missing(self):
        from airflow.sdk.exceptions import AirflowNotFoundException

        raise AirflowNotFoundException(f"The conn_id `{self.storage_conn_id}` isn't defined")


def active_namenode(conn_id: str, port: int | None) -> str:
    """The first NameNode of a connection's HA host list whose WebHDFS answers (the provider's probe)."""
    if port is None:
        raise ValueError(f"connection {conn_id!r}: several NameNodes need the port of their HTTP (WebHDFS) server")
    from airflow.providers.apache.hdfs.hooks.webhdfs import WebHDFSHook

    client = WebHDFSHook(conn_id).get_conn()  # raises when no NameNode answers
    return urlsplit(client.url).hostname or ""
