"""Stream data executors as services (`primus executor`, real subprocesses) against a real Kafka:
every produced sample handed out exactly once, across executor kills and trainer restarts, and
back-pressure from the trainer to Kafka."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from primus_lib.data.flight_client import ExecutorStreamReader
from primus_lib.metrics import names as n
from primus_lib.paths import JobPaths
from primus_lib.resources.discovery import LocalDiscovery
from primus_lib.spec import load_job
from tests.data.test_replay import _events
from tests.fixtures._proc import wait_for_line
from tests.fixtures.specs import DEMO_ROLES, demo_doc, kafka_stream, write_spec
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def executors():
    started: list[subprocess.Popen] = []

    def start(spec, index, replicas=2, *extra: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "primus_lib.cli.main", "executor", str(spec), "--index", str(index)]
        proc = subprocess.Popen(
            [*cmd, "--replicas", str(replicas), *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        started.append(proc)
        wait_for_line(proc, "serving")
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _spec(tmp_path, broker, topic, replicas=2, *, roles=None, shuffle=None, startup="earliest", name="ctr-demo"):
    """The demo job reading ``topic`` (a consumer group of its own) through ``replicas`` stream
    executors; ``roles``: other roles; ``shuffle`` and ``startup``: the stream's."""
    stream = kafka_stream(broker.bootstrap, topic, startup=startup, group_id=f"g-{topic}")
    stream.update({"shuffle": shuffle} if shuffle else {})
    roles = {**DEMO_ROLES, "stream_executor": {"replicas": replicas}, **(roles or {})}
    storage = {"root": str(tmp_path / "jobs")}
    data = f"file://{tmp_path}/data"
    doc = demo_doc(data, hours=3, rows_per_shard=100, stream=stream, roles=roles, storage=storage, name=name)
    path = write_spec(tmp_path / "job.yaml", doc)
    return path, load_job(path, env={})


def _produce(broker, topic, n, partitions, seed=3, prefix=""):
    events = _events(n, seed=seed)
    for event in events:
        event["request_id"] = prefix + event["request_id"]
    for p in range(partitions):
        broker.produce(topic, [json.dumps(e).encode() for e in events[p::partitions]], partition=p)
    return [e["request_id"] for e in events]


def _pull(reader, want: int, timeout: float = 180.0) -> list[str]:
    ids, deadline = [], time.monotonic() + timeout
    while len(ids) < want and time.monotonic() < deadline:
        batch = reader.poll(min(500, want - len(ids)), 0.5)
        if batch is not None:
            ids += batch.column("request_id").to_pylist()
    return ids


def _committed(broker, topic, group, partitions) -> dict[str, int]:
    consumer = Consumer(broker.config({"group.id": group}))
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return {f"{tp.topic}/{tp.partition}": tp.offset for tp in got if tp.offset >= 0}


def _once(ids: list[str]) -> bool:
    return all(n == 1 for n in collections.Counter(ids).values())


def test_two_executors_hand_out_every_sample_exactly_once(kafka_broker, tmp_path, executors):
    topic = kafka_broker.new_topic(partitions=4)
    produced = _produce(kafka_broker, topic, 2000, 4)
    spec, job = _spec(tmp_path, kafka_broker, topic)
    executors(spec, 0)
    executors(spec, 1)
    reader = ExecutorStreamReader(LocalDiscovery.for_stream(job, "realtime"), pull_rows=256)
    try:
        ids = _pull(reader, len(produced))
        assert _pull(reader, 1, timeout=2.0) == []  # nothing more
        stats = reader.executor_stats()
        assert sorted(stats) == [0, 1]
        owned = [set(s["partitions"]) for s in stats.values()]
        assert not owned[0] & owned[1] and len(owned[0] | owned[1]) == 4
        assert reader.position() == {f"{topic}/{p}": 500 for p in range(4)}
        assert _committed(kafka_broker, topic, f"g-{topic}", 4) == {}  # executors never commit on their own
        reader.commit(reader.position())
        assert _committed(kafka_broker, topic, f"g-{topic}", 4) == reader.position()
    finally:
        reader.close()
    assert sorted(ids) == sorted(produced) and _once(ids)


def test_kill_9_of_an_executor_and_a_trainer_restart_lose_and_repeat_nothing(kafka_broker, tmp_path, executors):
    topic = kafka_broker.new_topic(partitions=4)
    produced = _produce(kafka_broker, topic, 4000, 4, seed=11)
    spec, job = _spec(tmp_path, kafka_broker, topic)
    small = ("--buffer-rows", "300", "--poll-rows", "100")  # keeps them mid-stream
    procs = [executors(spec, 0, 2, *small), executors(spec, 1, 2, *small)]
    discovery = LocalDiscovery.for_stream(job, "realtime")
    reader = ExecutorStreamReader(discovery, buffer_rows=400, pull_rows=100)
    # the "trainer": trains rows, checkpoints its position, then commits through the executors
    trained = _pull(reader, 1000)
    checkpoint = reader.position()
    reader.commit(checkpoint)
    trained += _pull(reader, 500)  # taken after the checkpoint: served again if the trainer dies
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    procs[0] = executors(spec, 0, 2, *small)  # resumes from the committed offsets: behind the reader
    trained += _pull(reader, 1000)  # the puller re-attached and sought the executor to its own position
    checkpoint2, trained_at_checkpoint2 = reader.position(), list(trained)
    reader.commit(checkpoint2)
    assert _committed(kafka_broker, topic, f"g-{topic}", 4) == checkpoint2
    trained += _pull(reader, 300)
    procs[1].send_signal(signal.SIGKILL)  # and the trainer dies too, before its next checkpoint
    procs[1].wait()
    reader.close()
    procs[1] = executors(spec, 1, 2, *small)
    resumed = ExecutorStreamReader(discovery, buffer_rows=400, pull_rows=100)
    resumed.seek(checkpoint2)
    try:
        rest = _pull(resumed, len(produced) - len(trained_at_checkpoint2))
        assert _pull(resumed, 1, timeout=2.0) == []
    finally:
        resumed.close()
    assert _once(trained)  # the first trainer never saw a row twice, across the executor kill
    total = trained_at_checkpoint2 + rest
    assert sorted(total) == sorted(produced) and _once(total)


def test_a_dead_executors_partitions_move_to_the_other_and_back(kafka_broker, tmp_path, executors):
    topic = kafka_broker.new_topic(partitions=4)
    produced = _produce(kafka_broker, topic, 3000, 4, seed=13)
    spec, job = _spec(tmp_path, kafka_broker, topic)
    small = ("--buffer-rows", "300", "--poll-rows", "100")
    procs = [executors(spec, 0, 2, *small), executors(spec, 1, 2, *small)]
    reader = ExecutorStreamReader(
        LocalDiscovery.for_stream(job, "realtime"), buffer_rows=400, pull_rows=100, takeover_after=1.0
    )
    everything = {f"{topic}/{p}" for p in range(4)}
    try:
        ids = _pull(reader, 800)
        procs[1].send_signal(signal.SIGKILL)  # not restarted: executor 0 takes its partitions over
        procs[1].wait()
        ids += _pull(reader, len(produced) - 800)
        assert reader.takeovers == 1 and sorted(ids) == sorted(produced) and _once(ids)
        stats = reader.executor_stats()
        assert set(stats[0]["partitions"]) == everything
        assert stats[0]["readers"] == 1  # the adopted partitions joined its reader (was a second consumer)
        assert stats[0]["opened"] == 1  # on its consumer: no reopen (a consumer's start, docs/data.md)
        reader.commit(reader.position())  # the new owner commits the partitions it took over too
        assert (
            _committed(kafka_broker, topic, f"g-{topic}", 4)
            == reader.position()
            == {f"{topic}/{p}": 750 for p in range(4)}
        )
        executors(spec, 1, 2, *small)  # back: executor 0 lets go of half, executor 1 serves it again
        more = _produce(kafka_broker, topic, 400, 4, seed=14, prefix="more-")
        ids += _pull(reader, len(more))

        def split() -> list[set[str]] | None:  # each partition served by one executor, none missing
            owned = [set(s["partitions"]) for s in reader.executor_stats().values()]
            return owned if len(owned) == 2 and not owned[0] & owned[1] and owned[0] | owned[1] == everything else None

        owned = wait_for("executor 0 hands half of its partitions back to executor 1", split)
        assert len(owned[0]) == len(owned[1]) == 2
        assert [(s["readers"], s["opened"]) for s in reader.executor_stats().values()] == [(1, 1), (1, 1)]
    finally:
        reader.close()
    assert sorted(ids) == sorted(produced + more) and _once(ids)


def test_a_full_buffer_stops_kafka_polling_until_the_trainer_pulls(kafka_broker, tmp_path, executors):
    topic = kafka_broker.new_topic(partitions=1)
    produced = _produce(kafka_broker, topic, 3000, 1, seed=5)
    spec, job = _spec(tmp_path, kafka_broker, topic, replicas=1)
    executors(spec, 0, 1, "--buffer-rows", "200", "--poll-rows", "50")
    reader = ExecutorStreamReader(LocalDiscovery.for_stream(job, "realtime"), buffer_rows=200, pull_rows=50)
    try:
        assert reader.lag()[f"{topic}/0"] == 3000  # nothing is read before a trainer attaches
        ids = _pull(reader, 10)  # attached; then the trainer stops pulling
        snapshot = JobPaths.for_job(job).metrics_dir / "stream_executor-realtime-0.prom"
        wait_for("the scaler's snapshot shows the executor's buffer full", lambda: _fill(snapshot) >= 0.75)
        stats = reader.executor_stats()[0]  # full since a snapshot ago (5 s): it stopped polling Kafka
        lag = reader.lag()[f"{topic}/0"]
        # the executor's buffer (200) and the trainer side's (200 + one pull in hand) hold the rest back
        assert stats["rows"] >= 150 and stats["rows_in"] <= 200 + 200 + 2 * 50 + 10 and lag >= 3000 - 500, (stats, lag)
        ids += _pull(reader, len(produced) - 10)
        assert sorted(ids) == sorted(produced)
        assert reader.lag()[f"{topic}/0"] == 0
    finally:
        reader.close()


def _fill(snapshot) -> float:
    """The buffer utilisation in an executor's metrics snapshot (0 until it has one)."""
    lines = snapshot.read_text().splitlines() if snapshot.exists() else []
    fill = [line for line in lines if line.startswith(n.BUFFER_UTILISATION + "{")]
    return float(fill[0].split()[-1]) if fill else 0.0


def test_rows_at_or_below_the_accepted_position_are_dropped():
    """A restarted executor may serve rows again (from the committed offsets): dropped by offset."""
    import numpy as np
    import pyarrow as pa

    from primus_lib.data.buffer import SampleBuffer
    from primus_lib.data.flight import BufferFlightServer
    from primus_lib.resources.discovery import StaticDiscovery

    schema = pa.schema([("request_id", pa.string())])
    buffer = SampleBuffer(1000)
    for lo, hi in [(0, 10), (5, 15), (3, 8), (15, 20)]:  # replays overlapping what was served
        batch = pa.record_batch([pa.array([f"r{i}" for i in range(lo, hi)])], schema=schema)
        buffer.put(batch, (["t/0"] * (hi - lo), np.arange(lo, hi)))
    seeks = []
    actions = {"seek": lambda body: seeks.append(body) or {}}
    server = BufferFlightServer(buffer, schema, wait=0.05, tagged=True, actions=actions)
    reader = ExecutorStreamReader(StaticDiscovery([f"grpc://127.0.0.1:{server.port}"]), pull_rows=7)
    try:
        reader.seek({"t/0": 2})  # a checkpoint: rows 0 and 1 were trained before
        ids = _pull(reader, 18, timeout=10)
    finally:
        reader.close()
        server.shutdown()
    assert ids == [f"r{i}" for i in range(2, 20)]
    assert reader.duplicates == 2 + 5 + 5
    assert reader.position() == {"t/0": 20} and seeks[0]["position"] == {"t/0": 2}


def test_the_trainer_trains_from_executors_and_commits_after_its_checkpoints(
    kafka_broker, tmp_path, monkeypatch, capsys, executors
):
    from primus_lib.cli.main import main
    from primus_lib.train.runtime.feeds import stream_readers
    from primus_lib.train.runtime.trainer import Trainer, TrainerOptions
    from tests.fixtures.specs import ROLES, job_doc
    from tests.train.conftest import write_job

    topic = kafka_broker.new_topic(partitions=2, prefix="ctr")
    roles = {"stream_executor": {"replicas": 2}, **ROLES}
    doc = job_doc(hours=2, lag="1h", stream=kafka_stream(kafka_broker.bootstrap, topic), mode="online", roles=roles)
    spec = write_job(tmp_path, monkeypatch, doc, "kafka.yaml")
    assert main(["datagen", str(spec), "--rows-per-hour", "100", "--seed", "2", "--kafka", kafka_broker.bootstrap]) == 0
    events = (tmp_path / "data" / "stream" / "events.jsonl").read_text().splitlines()
    capsys.readouterr()
    executors(spec, 0)
    executors(spec, 1)
    job = load_job(spec)
    readers = stream_readers(job, lambda job: pytest.fail("the spec names executors: Kafka is not read directly"))
    assert [type(r).__name__ for r in readers["realtime"]] == ["ExecutorStreamReader"]
    trainer = Trainer(job, TrainerOptions(poll_interval=0.05, idle_exit=4, checkpoint_steps=1), readers)
    trainer.run()
    buffer = trainer.reader.buffers["realtime"]
    assert trainer.reader.served["realtime"] + buffer.rows == len(events)
    progress = json.loads(JobPaths.for_job(job).progress.read_text())
    checkpointed = progress["stream_position"]["realtime"][0]["offsets"]
    assert sum(checkpointed.values()) == len(events)
    group = f"primus-{job.name}-realtime"
    assert _committed(kafka_broker, topic, group, 2) == checkpointed


def test_the_local_backend_starts_the_executors_by_default(kafka_broker, tmp_path, monkeypatch):
    from primus_lib.resources import backend_for

    topic = kafka_broker.new_topic(partitions=3)
    produced = _produce(kafka_broker, topic, 900, 3, seed=8)
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    roles = {"trainer": {"command": sleep}, "data_executor": {"replicas": 1}}
    spec, job = _spec(tmp_path, kafka_broker, topic, roles=roles)
    backend = backend_for(job, str(spec))
    backend.submit()
    discovery = LocalDiscovery.for_stream(job, "realtime")
    try:
        found = wait_for("both executors announce themselves", lambda: len(discovery.locations()) >= 2, timeout=120)
        assert sorted(discovery.locations()) == [0, 1], found
        reader = ExecutorStreamReader(discovery)
        try:
            ids = _pull(reader, len(produced))
        finally:
            reader.close()
    finally:
        backend.stop()
    assert sorted(ids) == sorted(produced) and _once(ids)


def test_shared_state_discovery_serves_fresh_entries_only(tmp_path, monkeypatch):
    """Entries under the job's state: a registered executor is listed and kept fresh by its heartbeat;
    a stale one (its process killed: no heartbeat) is not; a clean stop removes the entry."""
    from primus_lib.resources.discovery import SharedStateDiscovery

    monkeypatch.setenv("NM_HOST", "node-7")
    stale = 2.0
    discovery = SharedStateDiscovery(tmp_path / "executors" / "s", heartbeat=0.2, stale=stale)
    discovery.register(0, "grpc://0.0.0.0:4100", {"stream": "s"})
    discovery.register(1, "grpc://10.0.0.5:4101", {"stream": "s"})
    dead = {"index": 2, "location": "grpc://h:4102", "heartbeat_at": time.time() - 600}
    (tmp_path / "executors" / "s" / "2.json").write_text(json.dumps(dead))

    def kept_fresh():  # both listed on heartbeats alone: their registration is older than `stale`
        entries = discovery.entries()
        beaten = sorted(entries) == [0, 1] and all(
            e["heartbeat_at"] > e["started_at"] + stale for e in entries.values()
        )
        return beaten and entries

    entries = wait_for("the heartbeats keep executors 0 and 1 fresh past `stale`", kept_fresh)
    assert {i: e["location"] for i, e in entries.items()} == {0: "grpc://node-7:4100", 1: "grpc://10.0.0.5:4101"}
    assert {"pid", "host", "started_at", "heartbeat_at"} <= set(entries[0])
    discovery.unregister(0)
    assert sorted(p.name for p in (tmp_path / "executors" / "s").iterdir()) == ["1.json", "2.json"]
    assert discovery.locations() == {1: "grpc://10.0.0.5:4101"}
    discovery.unregister(1)
    assert SharedStateDiscovery(tmp_path / "nowhere").locations() == {}
