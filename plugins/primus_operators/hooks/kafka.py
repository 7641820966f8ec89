"""Kafka client settings (librdkafka names) from an Airflow connection."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook


class PrimusKafkaHook(BaseHook):
    """``host[:port]`` (comma-separated hosts allowed) -> bootstrap.servers; login/password -> SASL;
    extra: ``security_protocol``, ``sasl_mechanism``, and ``config`` (raw librdkafka settings).
    """

    conn_name_attr = "kafka_conn_id"
    default_conn_name = "primus_kafka_default"
    conn_type = "primus_kafka"
    hook_name = "Primus Kafka"

    def __init__(self, kafka_conn_id: str = default_conn_name):
        super().__init__()
        self.kafka_conn_id = kafka_conn_id

    def client_config(self) -> dict[str, str]:
        conn = self.get_connection(self.kafka_conn_id)
        return kafka_config(conn.host, conn.port, conn.login, conn.password, conn.extra_dejson)


def kafka_config(
    host: str | None, port: int | None, login: str | None, password: str | None, extra: dict[str, Any]
) -> dict[str, str]:
    config: dict[str, str] = {}
    if host:
        config["bootstrap.servers"] = f"{host}:{port}" if port and "," not in host and ":" not in host else host
    if extra.get("security_protocol"):
        config["security.protocol"] = str(extra["security_protocol"])
    if login:
        config["sasl.username"] = login
        config["sasl.password"] = password or ""
        config.setdefault("sasl.mechanism", str(extra.get("sasl_mechanism", "PLAIN")))
        config.setdefault("security.protocol", "SASL_SSL")
    config.update({str(k): str(v) for k, v in (extra.get("config") or {}).items()})
    return config
