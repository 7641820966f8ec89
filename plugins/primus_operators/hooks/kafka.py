"""Kafka client settings (librdkafka names) of an Airflow connection (``primus_lib.credentials.kafka_config``)."""

from __future__ import annotations

from airflow.sdk import BaseHook

from primus_lib.credentials import kafka_config


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
        from primus_operators.hooks.connections import AirflowConnections

        conn = AirflowConnections().connection(self.kafka_conn_id)
        if conn is None:
            from airflow.sdk.exceptions import AirflowNotFoundException

            raise AirflowNotFoundException(f"The conn_id `{self.kafka_conn_id}` isn't defined")
        return kafka_config(conn)

    def test_connection(self) -> tuple[bool, str]:
        """The Airflow UI's "Test": log in and list the topics (a refused login says so)."""
        from confluent_kafka import Consumer, KafkaException

        from primus_lib.data.sources.kafka import LoginWatch

        try:
            config = self.client_config()
            login = LoginWatch(f"kafka {config.get('bootstrap.servers')} (connection {self.kafka_conn_id!r})")
            consumer = Consumer({**config, "group.id": "primus-connection-test", "log_level": "0", "error_cb": login})
            try:
                topics = login.first_metadata(consumer, None, timeout=10.0).topics
            finally:
                consumer.close()
        except KafkaException as exc:
            return False, str(exc) if isinstance(exc.args[0], str) else exc.args[0].str()
        except Exception as exc:
            return False, str(exc)
        return True, f"logged in to {config['bootstrap.servers']}: {len(topics)} topics"
