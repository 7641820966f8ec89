"""Hooks: Kafka, object storage (S3 / HDFS) and Kubernetes settings from Airflow connections.

The spec only names a connection (``connection_id``); secrets live in Airflow's connections
(metadata DB, secrets backend or ``AIRFLOW_CONN_*`` variables). A task resolves them with
``airflow_resolver()`` (``primus_lib.credentials``) into typed credentials for the engine's
factories; nothing is written to the process environment.
"""

from __future__ import annotations

from primus_operators.hooks.connections import AirflowConnections, airflow_resolver
from primus_operators.hooks.kafka import PrimusKafkaHook
from primus_operators.hooks.kubernetes import PrimusKubernetesHook
from primus_operators.hooks.storage import PrimusStorageHook

__all__ = ["AirflowConnections", "PrimusKafkaHook", "PrimusKubernetesHook", "PrimusStorageHook", "airflow_resolver"]
