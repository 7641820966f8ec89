"""Object-storage settings (S3, HDFS/WebHDFS) from an Airflow connection, as the env the data plane reads."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

S3_TYPES = {"aws", "s3", "primus_s3"}
HDFS_TYPES = {"hdfs", "webhdfs", "primus_hdfs"}


class PrimusStorageHook(BaseHook):
    """S3 (conn types ``aws``/``s3``): login/password = access/secret key, extra ``endpoint_url``,
    ``region_name``. HDFS/WebHDFS: login = user, extra ``kerberos_ticket_cache``.
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
        return storage_env(conn.conn_type or "", conn.host, conn.port, conn.login, conn.password, conn.extra_dejson)


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
        if extra.get("kerberos_ticket_cache"):
            env["KRB5CCNAME"] = str(extra["kerberos_ticket_cache"])
    else:
        raise ValueError(f"connection type {conn_type!r}: expected one of {sorted(S3_TYPES | HDFS_TYPES)}")
    return env
