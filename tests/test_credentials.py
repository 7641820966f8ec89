"""primus_lib.credentials: one path from a connection id to typed credentials (unit tests, no server;
the real stores are in tests/data/test_s3.py, test_hdfs.py, test_kafka.py and tests/airflow/)."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from primus_lib.credentials import (
    Connection,
    CredentialsError,
    Resolver,
    S3Credentials,
    SecretFiles,
    WebHdfsCredentials,
    current,
    mount,
    using,
    write_secret_files,
)
from primus_lib.paths import JobPaths
from tests.fixtures.specs import demo_doc, load

S3 = {"conn_type": "aws", "login": "AK", "password": "SK", "extra": {"endpoint_url": "http://s3:8333"}}


def _secrets(tmp_path, connections: dict) -> SecretFiles:
    directory = tmp_path / "secrets"
    directory.mkdir(exist_ok=True)
    for conn_id, body in connections.items():
        (directory / f"{conn_id}.json").write_text(body if isinstance(body, str) else json.dumps(body))
    return SecretFiles(directory)


def test_a_mounted_secret_file_resolves_to_typed_credentials(tmp_path):
    webhdfs = {"conn_type": "webhdfs", "host": "nn", "port": "9871", "login": "etl", "extra": '{"use_ssl": "yes"}'}
    resolver = Resolver(_secrets(tmp_path, {"state": S3, "logs": webhdfs}))
    found = resolver.storage("state")
    assert found == S3Credentials("AK", "SK", "http://s3:8333", None) and "SK" not in repr(found)
    assert resolver.storage("logs") == WebHdfsCredentials("etl", "https://nn:9871")
    assert "SK" not in repr(resolver.connection("state"))


def test_missing_and_malformed_connections_are_one_line_naming_the_field(tmp_path):
    resolver = Resolver(_secrets(tmp_path, {"bad": "[1]", "pg": {"conn_type": "postgres"}}))
    cases = {
        "gone": r"spec.storage.connection_id 'gone': not found \(no .*secrets/<id>.json\)",
        "bad": r"bad.json: expected a JSON connection object, found list",
        "pg": r"connection 'pg': type 'postgres', expected one of",
        "../etc/passwd": r"connection id '../etc/passwd': expected letters",
    }
    for conn_id, expected in cases.items():
        with pytest.raises(CredentialsError, match=expected) as caught:
            resolver.storage(conn_id, "spec.storage.connection_id")
        assert "\n" not in str(caught.value)
    with pytest.raises(CredentialsError, match=r"\$PRIMUS_SECRETS_DIR is unset"):
        Resolver(SecretFiles(None)).storage("state")


def test_no_named_connection_uses_the_default_of_the_uris_kind_only(tmp_path):
    resolver = Resolver(_secrets(tmp_path, {"primus_storage_default": S3}))
    assert resolver.storage(None, uri="s3://bucket/x").access_key_id == "AK"
    assert resolver.storage(None, uri="webhdfs://nn:9870/x") is None  # an S3 default is not WebHDFS's
    assert resolver.storage(None, uri="/local/path") is None
    assert Resolver(SecretFiles(None)).storage(None, uri="s3://bucket/x") is None  # the SDK's defaults


def test_the_process_default_follows_the_setting_and_using_scopes_a_resolver_to_its_thread(tmp_path, monkeypatch):
    files = _secrets(tmp_path, {"state": S3})
    monkeypatch.setenv("PRIMUS_SECRETS_DIR", str(files.directory))
    assert current().storage("state").access_key_id == "AK"
    other = Resolver(type("Other", (), {"connection": lambda self, c: Connection(c, "aws", login="OTHER")})())
    seen = {}
    with using(other):
        thread = threading.Thread(target=lambda: seen.update(t=current().storage("state").access_key_id))
        thread.start()
        thread.join()
        assert current().storage("state").access_key_id == "OTHER"
    assert seen == {"t": "AK"}  # another thread keeps the process default
    assert current().storage("state").access_key_id == "AK"


def test_mounting_writes_private_files_a_child_resolves_the_same(tmp_path):
    source = Resolver(_secrets(tmp_path, {"state": S3, "primus_storage_default": S3, "unused": S3}))
    env = mount(source, ["state", "missing"], tmp_path / "roles" / "connections")
    directory = tmp_path / "roles" / "connections"
    assert env == {"PRIMUS_SECRETS_DIR": str(directory)}
    assert sorted(p.name for p in directory.iterdir()) == ["primus_storage_default.json", "state.json"]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in directory.iterdir())
    assert Resolver(SecretFiles(directory)).storage("state") == source.storage("state")
    assert mount(Resolver(SecretFiles(None)), ["state"], tmp_path / "none") == {}
    write_secret_files(directory, [Connection("state", "aws", login="NEW", password="P")])  # replaced whole
    assert Resolver(SecretFiles(directory)).storage("state").access_key_id == "NEW"


def test_job_paths_complete_the_database_url_and_defer_an_unresolved_store(tmp_path, monkeypatch):
    storage = {
        "root": "s3://state/jobs",
        "connection_id": "state",
        "database": "postgresql+psycopg2://primus@db:5432/primus",
        "database_connection_id": "ledger",
    }
    job = load(demo_doc(f"file://{tmp_path}/data", hours=3, rows_per_shard=100, storage=storage), env={})
    monkeypatch.delenv("PRIMUS_SECRETS_DIR", raising=False)
    paths = JobPaths.for_job(job)  # no connection here: paths are still computed (a DAG parse)
    assert str(paths.progress) == "s3://state/jobs/ctr-demo/trainer/progress.json"
    with pytest.raises(CredentialsError, match="spec.storage.connection_id 'state': not found"):
        paths.progress.read_bytes()
    ledger = {"conn_type": "postgres", "login": "svc", "password": "pw@1"}
    files = _secrets(tmp_path, {"state": S3, "ledger": ledger})
    monkeypatch.setenv("PRIMUS_SECRETS_DIR", str(files.directory))
    url = JobPaths.for_job(job).ledger
    assert (url.username, url.password, url.host) == ("svc", "pw@1", "db") and "pw@1" not in str(url)
    assert os.environ.get("AWS_ACCESS_KEY_ID") != "AK"  # nothing reached the environment


def test_an_http_connection_gives_the_url_and_login_as_airflows_http_hook_reads_them():
    from primus_lib.credentials import Connection, HttpLogin, http_login

    assert http_login(Connection("p", "http", host="prom", port=9090, login="u", password="pw")) == HttpLogin(
        "http://prom:9090", "u", "pw"
    )
    assert http_login(Connection("p", "http", host="prom.example", schema="https")).url == "https://prom.example"
    assert http_login(Connection("p", "http", host="https://prom.example:8443/", port=1)).url == (
        "https://prom.example:8443"
    )
    token = http_login(Connection("p", "http", host="prom", extra={"token": "t0k"}))
    assert (token.login, token.password, token.token) == (None, None, "t0k") and "t0k" not in repr(token)
