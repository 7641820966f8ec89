"""Hooks: Kafka, object storage (S3 / HDFS) and Kubernetes settings from Airflow connections.

The spec only names a connection (``connection_id``); secrets live in Airflow's connections
(metadata DB, secrets backend or ``AIRFLOW_CONN_*`` variables). ``connection_env`` turns the
connections a job names into the environment the data plane and the trainer read.
"""

from __future__ import annotations

from primus_operators.hooks.env import connection_env, job_connection_env
from primus_operators.hooks.kafka import PrimusKafkaHook
from primus_operators.hooks.kubernetes import PrimusKubernetesHook
from primus_operators.hooks.storage import PrimusStorageHook

__all__ = ["PrimusKafkaHook", "PrimusKubernetesHook", "PrimusStorageHook", "connection_env", "job_connection_env"]
