"""The Kafka broker asks every client for a login, as a production broker does (SASL SCRAM-SHA-256,
tests/fixtures/kafka.py): a client without it or with a wrong password is refused, and Primus's
readers say so in one line naming the topic, the broker and the connection (librdkafka reports a
refused login only to ``error_cb``; a request itself just times out as a transport failure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from primus_lib.credentials import LoginRefused
from primus_lib.data.executor.partitions import stream_partitions
from primus_lib.data.sources import open_stream
from tests.data.helpers import write_layout
from tests.fixtures.specs import demo_doc, job_doc, kafka_stream, load, write_spec

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _refused(config: dict) -> bool:
    try:
        AdminClient({**config, "log_level": "0"}).list_topics(timeout=3)
    except KafkaException:
        return True
    return False


def test_the_broker_refuses_a_client_without_the_login_or_with_a_wrong_one(kafka_broker):
    assert _refused({"bootstrap.servers": kafka_broker.bootstrap})
    assert _refused(kafka_broker.config({"sasl.password": kafka_broker.login.password + "x"}))
    assert _refused(kafka_broker.config({"sasl.mechanism": "PLAIN"}))  # the client listener takes SCRAM only
    assert not _refused(kafka_broker.config())
    server = kafka_broker.server
    assert server is not None
    assert server.config.stat().st_mode & 0o077 == 0  # server.properties holds the login
    assert not (server.root / "format.args").exists()  # the storage tool's argument file is gone
    assert kafka_broker.login.password not in server.log.read_text(errors="replace")


def _wrong_password(kafka_broker, tmp_path: Path) -> str:
    """Mount the test broker's connection with a wrong password; returns that password."""
    conn = kafka_broker.connection()
    wrong = conn["password"][::-1] + "-wrong"
    (tmp_path / "secrets" / "primus_kafka.json").write_text(json.dumps({**conn, "password": wrong}))
    return wrong


def test_a_reader_with_a_wrong_password_stops_at_once_naming_its_source(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=2)
    stream = kafka_stream(kafka_broker.bootstrap, topic, options={"log_level": "0"})
    job = load(demo_doc(f"file://{tmp_path}/data", hours=3, stream=stream), storage=tmp_path / "jobs")
    wrong = _wrong_password(kafka_broker, tmp_path)
    spec = job.stream("realtime")
    with pytest.raises(LoginRefused) as refused:  # not the transport failure a minute of retries ends in
        open_stream(job, spec, spec.sources[0])
    message = str(refused.value)
    assert message.startswith(f"kafka topic '{topic}' at {kafka_broker.bootstrap} (connection 'primus_kafka'): ")
    assert "the broker refused the login" in message and "SCRAM-SHA-256" in message, message
    assert wrong not in message
    with pytest.raises(LoginRefused, match="refused the login"):  # the executors' listing of partitions
        stream_partitions(job, "realtime")


def test_primus_executor_with_a_wrong_password_is_one_line_and_exit_1(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=1)
    stream = kafka_stream(kafka_broker.bootstrap, topic, options={"log_level": "0"})
    doc = demo_doc(f"file://{tmp_path}/data", hours=3, stream=stream, storage={"root": str(tmp_path / "jobs")})
    spec = write_spec(tmp_path / "job.yaml", doc)
    wrong = _wrong_password(kafka_broker, tmp_path)
    command = [sys.executable, "-m", "primus_lib.cli.main", "executor", str(spec), "--index", "0", "--replicas", "1"]
    env = {**os.environ, "PRIMUS_HOME": str(tmp_path / "home")}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"primus executor: stream 'realtime': kafka topic '{topic}' at {kafka_broker.bootstrap}")
    assert "the broker refused the login" in lines[0] and wrong not in lines[0], lines[0]


def test_primus_train_and_eval_with_a_wrong_password_are_one_line_and_exit_1(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=1)
    stream = kafka_stream(kafka_broker.bootstrap, topic, options={"log_level": "0"})
    # no stream executors: the trainer and eval read the topic themselves
    doc = job_doc(hours=2, lag="1h", stream=stream, mode="online", storage={"root": str(tmp_path / "jobs")})
    spec = write_spec(tmp_path / "job.yaml", doc)
    write_layout(tmp_path / "data", hours=2, rows=20, files=1)  # the batch windows eval reads first
    wrong = _wrong_password(kafka_broker, tmp_path)
    env = {**os.environ, "PRIMUS_HOME": str(tmp_path / "home"), "PRIMUS_DATA": str(tmp_path / "data")}
    prefix = (
        f"kafka topic '{topic}' at {kafka_broker.bootstrap} (connection 'primus_kafka'): the broker refused the login"
    )
    for command in (
        ["train", str(spec), "--idle-exit", "60"],
        ["eval", str(spec), "--out", str(tmp_path / "eval"), "-q"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "primus_lib.cli.main", *command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode in (1, 2) and "Traceback" not in done.stderr, (command, done.stderr[-3000:])
        lines = [line for line in done.stderr.strip().splitlines() if prefix in line]
        assert len(lines) == 1 and wrong not in done.stderr, (command, done.stderr[-3000:])
    assert not (tmp_path / "eval").exists()


def test_datagen_to_kafka_with_a_wrong_password_says_so_and_exits_1(kafka_broker, tmp_path, monkeypatch, capsys):
    from primus_lib.cli.main import main

    topic = kafka_broker.new_topic(partitions=1)
    doc = job_doc(hours=1, lag="1h", stream=kafka_stream(kafka_broker.bootstrap, topic, options={"log_level": "0"}))
    spec = write_spec(tmp_path / "job.yaml", doc)
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    wrong = _wrong_password(kafka_broker, tmp_path)
    assert main(["datagen", str(spec), "--rows-per-hour", "50", "--kafka", kafka_broker.bootstrap, "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "confirmed 0 of " in err and "the broker refused the login" in err and wrong not in err, err
    assert (tmp_path / "data" / "stream" / "events.jsonl").stat().st_size > 0  # the files are complete
