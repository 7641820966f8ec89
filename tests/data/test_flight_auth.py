"""The stream executors' Flight service serves only its job (``primus_lib.data.flight_auth``), and rows
a reader took but never acknowledged are served again (``primus_lib.data.executor.leases``).

Against real ``primus executor`` processes and a real Kafka: every endpoint (reads, every action,
the listings) refuses a client without the job's token, with another job's token or with a
malformed header; the refused calls take no row and move no offset; the token is in no argument,
environment or log line of the executor. A reader that reads without acknowledging and goes away
has its rows served again to the next reader; acknowledged rows are not.
"""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from confluent_kafka import Consumer, TopicPartition

from primus_lib.data import flight_auth
from primus_lib.data.buffer import past
from primus_lib.data.executor.leases import LeasedBuffer
from primus_lib.data.flight import FlightBufferClient
from primus_lib.data.flight_auth import Credential, credential_for
from primus_lib.data.flight_client import ExecutorStreamReader
from primus_lib.resources.discovery import TOKEN_NAME, LocalDiscovery
from primus_lib.spec import load_job
from tests.data.test_replay import _events
from tests.fixtures.specs import DEMO_ROLES, demo_doc, kafka_stream, write_spec

ROOT = Path(__file__).resolve().parents[2]
ACTIONS = ("seek", "commit", "assign", "ack", "stats", "lag", "partitions")


# -- the credential and the lease, in-process ------------------------------------------------------
def test_the_token_is_made_once_per_job_readable_by_its_owner_only(tmp_path):
    discovery = LocalDiscovery(tmp_path / "job" / "resources" / "executors" / "realtime")
    first, second = credential_for(discovery), Credential(discovery.token.where)
    token = first.token()
    where = discovery.token.where
    assert second.token() == token and len(token) >= 32  # the second process reads the first one's
    assert stat.S_IMODE(where.stat().st_mode) == 0o600
    assert sorted(p.name for p in where.parent.iterdir()) == [TOKEN_NAME]  # no temp file left
    other = Credential(tmp_path / "other-job" / TOKEN_NAME).token()
    assert other != token and first.accepts(token)
    assert not first.accepts(other) and not first.accepts("") and not first.accepts(None)
    assert not first.accepts(token[:-1]) and not first.accepts(token + "x")


def test_a_server_settles_on_the_stored_token_when_another_process_replaced_it(tmp_path, monkeypatch):
    """Two processes making a remote token at once: the last PUT wins; the loser re-reads on a mismatch."""
    where = tmp_path / TOKEN_NAME
    server = Credential(where)
    mine = server.token()
    where.write_text("the-token-another-process-stored-last")
    monkeypatch.setattr(flight_auth, "REFRESH_SECONDS", 0.0)
    assert server.accepts("the-token-another-process-stored-last") and not server.accepts(mine)


def test_a_mounted_secret_is_never_made():
    missing = Credential(Path("/nonexistent/primus-flight/token"), create=False)
    with pytest.raises(FileNotFoundError, match="lacks the job's Secret"):
        missing.token()
    assert not Path("/nonexistent/primus-flight").exists()


def _tagged(lo: int, hi: int, key: str = "t/0") -> tuple[pa.RecordBatch, tuple[list[str], np.ndarray]]:
    return pa.record_batch([pa.array(range(lo, hi))], names=["x"]), ([key] * (hi - lo), np.arange(lo, hi))


def test_leased_rows_count_against_the_capacity_and_come_back_in_order_unless_acknowledged():
    buffer = LeasedBuffer(100, hold=0.2)
    for lo in (0, 10, 20):
        buffer.put(*_tagged(lo, lo + 10))
    first = buffer.lease(15, 0.1)
    assert list(first[2]) == list(range(15)) and buffer.leased() == 15 and len(buffer) == 15
    assert not buffer.put(*_tagged(30, 110), timeout=0.1)  # 15 waiting + 15 leased + 80 > 100: Kafka waits
    deadline = time.monotonic() + 30
    while buffer.leased() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(buffer.lease(30, 0.1)[2]) == list(range(30))  # the expired lease first, in offset order
    assert buffer.ack({"t/0": 15}) == 15 and buffer.leased() == 15  # rows 15..29 are still out
    assert buffer.clear() == 15 and buffer.leased() == 0 and buffer.put(*_tagged(30, 110), timeout=0.1)


# -- real executors --------------------------------------------------------------------------------
def _spec(tmp_path: Path, broker, topic: str, name: str = "ctr-demo") -> Path:
    stream = kafka_stream(broker.bootstrap, topic, group_id=f"g-{topic}")
    roles, storage = {**DEMO_ROLES, "stream_executor": {"replicas": 1}}, {"root": str(tmp_path / "jobs")}
    doc = demo_doc(
        f"file://{tmp_path}/data", hours=3, rows_per_shard=100, name=name, stream=stream, roles=roles, storage=storage
    )
    return write_spec(tmp_path / f"{name}.yaml", doc)


def _produce(broker, topic: str, n: int) -> list[str]:
    events = _events(n, seed=11)
    broker.produce(topic, [json.dumps(e).encode() for e in events], partition=0)
    return [e["request_id"] for e in events]


@pytest.fixture
def executor(tmp_path):
    """Start ``primus executor`` (output to a file) and wait until it is registered."""
    started: list[subprocess.Popen] = []

    def start(spec: Path, *extra: str) -> tuple[subprocess.Popen, str, Path]:
        log = tmp_path / f"executor-{len(started)}.log"
        cmd = [sys.executable, "-m", "primus_lib.cli.main", "executor", str(spec), "--index", "0", *extra]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        started.append(proc)
        discovery = LocalDiscovery.for_stream(load_job(spec, env={}), "realtime")
        deadline = time.monotonic() + 90
        while not discovery.locations() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert discovery.locations(), f"the executor did not register:\n{log.read_text()[-3000:]}"
        return proc, discovery.locations()[0], log

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _committed(broker, topic: str) -> dict[str, int]:
    consumer = Consumer(broker.config({"group.id": f"g-{topic}"}))
    try:
        got = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        consumer.close()
    return {f"{tp.topic}/{tp.partition}": tp.offset for tp in got if tp.offset >= 0}


def _refusals(location: str, headers: list[tuple[bytes, bytes]], topic: str, only: tuple[str, ...] = ()) -> list[str]:
    """Every endpoint (or those named in ``only``) called with ``headers``: the names of those NOT refused."""
    client = flight.connect(location)
    options = flight.FlightCallOptions(timeout=10, headers=headers)
    key = f"{topic}/0"
    bodies = {"seek": {"position": {key: 0}}, "commit": {"position": {key: 500}}, "ack": {"position": {key: 500}}}

    def action(name: str):
        return lambda: list(client.do_action(flight.Action(name, json.dumps(bodies.get(name, {})).encode()), options))

    calls = {f"action {a}": action(a) for a in ACTIONS}
    schema = pa.schema([("a", pa.int64())])
    calls["DoGet rows=50"] = lambda: client.do_get(flight.Ticket(b"rows=50"), options=options).read_all()
    calls["ListActions"] = lambda: client.list_actions(options=options)
    calls["ListFlights"] = lambda: list(client.list_flights(options=options))
    calls["GetFlightInfo"] = lambda: client.get_flight_info(flight.FlightDescriptor.for_path("x"), options=options)
    calls["DoPut"] = lambda: client.do_put(flight.FlightDescriptor.for_path("x"), schema, options=options)[0].close()
    let_through = []
    try:
        for name, call in calls.items():
            if only and name not in only:
                continue
            try:
                call()
            except flight.FlightUnauthenticatedError:
                continue
            except (flight.FlightError, pa.ArrowException):
                pass  # answered (e.g. not implemented): the middleware let it in
            let_through.append(name)
    finally:
        client.close()
    return let_through


def test_every_endpoint_refuses_a_caller_without_the_jobs_token(kafka_broker, tmp_path, executor):
    topic = kafka_broker.new_topic(partitions=1)
    produced = _produce(kafka_broker, topic, 400)
    spec = _spec(tmp_path, kafka_broker, topic)
    proc, location, log = executor(spec)
    job = load_job(spec, env={})
    discovery = LocalDiscovery.for_stream(job, "realtime")
    token = credential_for(discovery).token()
    other_job = load_job(_spec(tmp_path, kafka_broker, topic, "other"), env={})
    other = credential_for(LocalDiscovery.for_stream(other_job, "realtime")).token()
    assert other != token
    bearer = [(b"authorization", f"Bearer {token}".encode())]
    strangers = {
        "no token": [],
        "another job's token": [(b"authorization", f"Bearer {other}".encode())],
        "the token without its scheme": [(b"authorization", token.encode())],
        "the token twice": bearer + bearer,
    }
    for who, headers in strangers.items():
        assert _refusals(location, headers, topic) == [], who
    harmless = ("action stats", "action partitions", "action lag", "ListActions", "ListFlights", "GetFlightInfo")
    assert set(_refusals(location, bearer, topic, harmless)) == set(harmless)  # with the token they get in

    owner = FlightBufferClient(location, timeout=10, token=token)
    try:
        stats = owner.stats()
    finally:
        owner.close()
    assert stats["refused"] == 4 * (len(ACTIONS) + 5) and stats["committed"] == {} and stats["rows_in"] == 0
    assert _committed(kafka_broker, topic) == {}  # the refused commits moved no offset
    reader = ExecutorStreamReader(discovery, pull_rows=100)  # the job's own reader takes every row, once
    try:
        ids, deadline = [], time.monotonic() + 90
        while len(ids) < len(produced) and time.monotonic() < deadline:
            batch = reader.poll(500, 0.5)
            if batch is not None:
                ids += batch.column("request_id").to_pylist()
        assert sorted(ids) == sorted(produced)
        reader.commit(reader.position())
    finally:
        reader.close()
    assert _committed(kafka_broker, topic) == {f"{topic}/0": len(produced)}
    # the token is in no argument, environment variable or log line of the executor
    argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    text = log.read_text()
    assert "serving" in text and "refused a Flight" in text
    for where, content in (("argv", argv), ("environment", environ), ("log", text)):
        assert token not in content and other not in content, where


def _pop(client: FlightBufferClient, rows: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = client.pop_tagged(rows)
        if got is not None:
            return got
    raise AssertionError(f"no rows within {timeout:.0f} s")


def test_rows_a_reader_took_but_never_acknowledged_are_served_again(kafka_broker, tmp_path, executor):
    topic = kafka_broker.new_topic(partitions=1)
    produced = _produce(kafka_broker, topic, 300)
    spec = _spec(tmp_path, kafka_broker, topic)
    _, location, _ = executor(spec, "--lease-seconds", "1.5", "--poll-rows", "100")
    token = credential_for(LocalDiscovery.for_stream(load_job(spec, env={}), "realtime")).token()

    def client() -> FlightBufferClient:
        return FlightBufferClient(location, timeout=30, token=token)

    first = client()
    first.action("seek", {})  # attach: the executor reads Kafka from the committed/startup offsets
    batch, keys, offsets = _pop(first, 60)
    taken = batch.column("request_id").to_pylist()
    assert taken == produced[: len(taken)] and list(offsets) == list(range(len(taken)))
    first.close()  # gone without acknowledging

    second = client()
    deadline = time.monotonic() + 60
    while second.stats()["leased"] and time.monotonic() < deadline:  # the lease runs out: back in the buffer
        time.sleep(0.2)
    again, keys, offsets = _pop(second, len(taken))
    assert again.column("request_id").to_pylist() == taken and list(offsets) == list(range(len(taken)))
    assert second.action("ack", {"position": past(keys, offsets)}) == {"released": len(taken)}
    rest = []
    while len(rest) < len(produced) - len(taken):  # read and acknowledge everything else
        batch, keys, offsets = _pop(second, 100)
        second.action("ack", {"position": past(keys, offsets)})
        rest += batch.column("request_id").to_pylist()
    assert rest == produced[len(taken) :]
    deadline = time.monotonic() + 3 * 1.5  # past the lease: nothing acknowledged comes back
    while time.monotonic() < deadline:
        assert second.pop_tagged(100) is None
    stats = second.stats()
    second.close()
    assert stats["leased"] == 0 and stats["rows"] == 0
