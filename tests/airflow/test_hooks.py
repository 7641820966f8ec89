from __future__ import annotations

import json
import os

import pytest
from primus_operators.hooks import (
    PrimusKafkaHook,
    PrimusKubernetesHook,
    PrimusStorageHook,
    connection_env,
    job_connection_env,
)

from tests.fixtures.airflow import JOB_SPEC

S3 = {
    "conn_type": "aws",
    "login": "AKIA-TEST",
    "password": "secret-key",
    "extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
}
KAFKA = {
    "conn_type": "primus_kafka",
    "host": "b1:9092,b2:9092",
    "login": "svc-user",
    "password": "svc-pass",
    "extra": {"security_protocol": "SASL_PLAINTEXT", "config": {"client.id": "primus"}},
}


def _conn(monkeypatch, conn_id: str, body: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))


def test_storage_hook_maps_an_s3_connection_to_the_data_planes_env(monkeypatch):
    _conn(monkeypatch, "logs_s3", S3)
    assert PrimusStorageHook("logs_s3").env() == {
        "AWS_ACCESS_KEY_ID": "AKIA-TEST",
        "AWS_SECRET_ACCESS_KEY": "secret-key",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    _conn(
        monkeypatch,
        "hdfs_main",
        {"conn_type": "webhdfs", "login": "etl", "extra": {"kerberos_ticket_cache": "/tmp/krb5cc"}},
    )
    assert PrimusStorageHook("hdfs_main").env() == {"HADOOP_USER_NAME": "etl", "KRB5CCNAME": "/tmp/krb5cc"}
    _conn(monkeypatch, "pg", {"conn_type": "postgres"})
    with pytest.raises(ValueError, match="connection type 'postgres'"):
        PrimusStorageHook("pg").env()


def test_kafka_and_kubernetes_hooks_read_their_connections(monkeypatch):
    _conn(monkeypatch, "events", KAFKA)
    assert PrimusKafkaHook("events").client_config() == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.username": "svc-user",
        "sasl.password": "svc-pass",
        "sasl.mechanism": "PLAIN",
        "client.id": "primus",
    }
    _conn(
        monkeypatch,
        "k8s",
        {
            "conn_type": "kubernetes",
            "extra": {"kube_config_path": "/etc/kube/config", "namespace": "ml", "cluster_context": "prod"},
        },
    )
    hook = PrimusKubernetesHook("k8s")
    assert hook.settings()["namespace"] == "ml" and hook.settings()["in_cluster"] is False
    assert hook.env() == {
        "KUBECONFIG": "/etc/kube/config",
        "PRIMUS_KUBE_CONTEXT": "prod",
        "PRIMUS_KUBE_NAMESPACE": "ml",
    }


def _job(text: str):
    from primus_lib.spec import parse_job

    return parse_job(text, "job.yaml", env={"PRIMUS_DATA": "/data"})


def test_the_spec_only_names_connections_and_the_operators_apply_them_for_the_block(monkeypatch):
    _conn(monkeypatch, "logs_s3", S3)
    spec = JOB_SPEC.format(name="conn", start="2026-11-01T00:00:00Z", end="2026-11-01T02:00:00Z")
    spec = spec.replace(
        "format: parquet, success_marker: _SUCCESS}",
        "format: parquet, success_marker: _SUCCESS, connection_id: logs_s3}",
        1,
    )
    job = _job(spec)
    assert "secret-key" not in spec
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    with connection_env(job) as env:
        assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIA-TEST" and env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert "AWS_ACCESS_KEY_ID" not in os.environ
    # Two sources naming different S3 accounts cannot share one process environment: say so.
    _conn(monkeypatch, "other_s3", {**S3, "login": "AKIA-OTHER"})
    both = spec.replace("success_marker: _SUCCESS}", "success_marker: _SUCCESS, connection_id: other_s3}", 1)
    with pytest.raises(ValueError, match="AWS_ACCESS_KEY_ID differently"):
        job_connection_env(_job(both))


def test_storage_hook_gives_the_connection_as_typed_credentials_without_touching_the_environment(monkeypatch):
    """What a trigger hands to primus_lib.filesystems.resolve: the same values as the env form."""
    import asyncio

    from primus_lib.filesystems import S3Credentials, WebHdfsCredentials, credentials_env

    _conn(monkeypatch, "logs_s3", S3)
    webhdfs = {"conn_type": "webhdfs", "host": "nn1", "port": 9871, "login": "etl", "extra": {"use_ssl": "true"}}
    _conn(monkeypatch, "nn", webhdfs)
    before = dict(os.environ)
    s3 = asyncio.run(PrimusStorageHook("logs_s3").acredentials())
    assert s3 == S3Credentials("AKIA-TEST", "secret-key", "http://127.0.0.1:9000", "eu-west-1")
    assert credentials_env(s3) == PrimusStorageHook("logs_s3").env()
    assert "secret-key" not in repr(s3)
    assert asyncio.run(PrimusStorageHook("nn").acredentials()) == WebHdfsCredentials("etl", "https://nn1:9871")
    assert dict(os.environ) == before
