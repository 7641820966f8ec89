from __future__ import annotations

import json
import os

import pytest
from primus_operators.hooks import PrimusKafkaHook, PrimusKubernetesHook, PrimusStorageHook, airflow_resolver

from tests.fixtures.specs import airflow_doc, batch_stream, job_yaml

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


def test_storage_hook_maps_an_s3_connection_to_typed_credentials(monkeypatch):
    from primus_lib.credentials import S3Credentials, WebHdfsCredentials

    _conn(monkeypatch, "logs_s3", S3)
    assert PrimusStorageHook("logs_s3").credentials() == S3Credentials(
        "AKIA-TEST", "secret-key", "http://127.0.0.1:9000", "eu-west-1"
    )
    _conn(monkeypatch, "hdfs_main", {"conn_type": "webhdfs", "login": "etl"})
    assert PrimusStorageHook("hdfs_main").credentials() == WebHdfsCredentials("etl", None)
    _conn(monkeypatch, "pg", {"conn_type": "postgres"})
    with pytest.raises(ValueError, match="type 'postgres', expected one of"):
        PrimusStorageHook("pg").credentials()


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
    assert hook.settings()["kubeconfig"] == "/etc/kube/config" and hook.settings()["context"] == "prod"


def _job(text: str):
    from primus_lib.spec import parse_job

    return parse_job(text, "job.yaml", env={"PRIMUS_DATA": "/data"})


def test_the_spec_only_names_connections_and_a_task_resolves_them_without_the_environment(monkeypatch, tmp_path):
    """The operators install airflow_resolver() around their work: the engine's factories get each
    source's own credentials (two accounts in one process), and os.environ is never written."""
    from primus_lib.credentials import S3Credentials, current, using
    from primus_lib.data.dtgg.ops import DataSourceOp
    from primus_lib.paths import JobPaths

    _conn(monkeypatch, "logs_s3", S3)
    _conn(monkeypatch, "other_s3", {**S3, "login": "AKIA-OTHER"})
    stream = batch_stream("s3://bucket", connection_id="logs_s3")
    stream["sources"][1]["connection_id"] = "other_s3"  # clicks: the other account
    storage = {"root": "s3://state", "connection_id": "logs_s3"}
    spec = job_yaml(airflow_doc("conn", hours=2, streams=[stream], storage=storage))
    job = _job(spec)
    assert "secret-key" not in spec
    before = dict(os.environ)
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path))
    with using(airflow_resolver()):
        stream = job.stream("history")
        keys = [current().storage(s.connection_id) for s in stream.sources]
        assert [k.access_key_id for k in keys] == ["AKIA-TEST", "AKIA-OTHER"]
        assert isinstance(keys[0], S3Credentials) and "secret-key" not in repr(keys[0])
        op = DataSourceOp(job, stream, stream.sources[1])  # resolved in the op: the other account
        assert op.location.fs.region == "eu-west-1"
        assert JobPaths.for_job(job).shared is not None
    monkeypatch.delenv("PRIMUS_HOME")
    assert dict(os.environ) == before  # nothing written to the process environment
    with pytest.raises(ValueError, match=r"spec.storage.connection_id 'logs_s3': not found \(no secrets directory"):
        JobPaths.for_job(job).progress.read_bytes()  # outside Airflow a connection is a secret file: none here


def test_storage_hook_gives_the_connection_as_typed_credentials_without_touching_the_environment(monkeypatch):
    """What a trigger hands to primus_lib.filesystems.resolve."""
    import asyncio

    from primus_lib.filesystems import S3Credentials, WebHdfsCredentials

    _conn(monkeypatch, "logs_s3", S3)
    webhdfs = {"conn_type": "webhdfs", "host": "nn1", "port": 9871, "login": "etl", "extra": {"use_ssl": "true"}}
    _conn(monkeypatch, "nn", webhdfs)
    before = dict(os.environ)
    s3 = asyncio.run(PrimusStorageHook("logs_s3").acredentials())
    assert s3 == S3Credentials("AKIA-TEST", "secret-key", "http://127.0.0.1:9000", "eu-west-1")
    assert s3 == PrimusStorageHook("logs_s3").credentials()
    assert "secret-key" not in repr(s3)
    assert asyncio.run(PrimusStorageHook("nn").acredentials()) == WebHdfsCredentials("etl", "https://nn1:9871")
    assert dict(os.environ) == before


@pytest.mark.integration
def test_the_kafka_hook_tests_its_connection_against_the_broker(kafka_broker, monkeypatch):
    """The Airflow UI's "Test" button: a login the broker takes, then one it refuses."""
    _conn(monkeypatch, "events", kafka_broker.connection())
    ok, message = PrimusKafkaHook("events").test_connection()
    assert ok and message.startswith(f"logged in to {kafka_broker.bootstrap}: "), message
    wrong = "not-" + kafka_broker.login.password
    _conn(monkeypatch, "events", kafka_broker.connection(password=wrong))
    ok, message = PrimusKafkaHook("events").test_connection()
    assert not ok and "(connection 'events'): the broker refused the login" in message and wrong not in message
