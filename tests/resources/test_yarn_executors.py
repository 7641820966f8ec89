"""Stream executors on YARN, found through the job's shared state on HDFS (a real MiniYARNCluster
with its HDFS, and a real Kafka): the YARN backend starts two ``primus executor`` containers, each
announces itself under ``executors/<stream>/`` on HDFS, the test process (the trainer's host) finds
both and pulls every produced message exactly once; a hung executor's entry goes stale, and after a
kill -9 of it YARN's restart announces a new one."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from primus_lib.data.flight_client import ExecutorStreamReader
from primus_lib.resources.discovery import HEARTBEAT_SECONDS, SharedStateDiscovery, discovery_for
from primus_lib.resources.yarn import YarnBackend
from primus_lib.spec import load_job
from tests.data.test_stream_executor import _once, _produce, _pull
from tests.fixtures.specs import DEMO_ROLES, demo_doc, kafka_stream, write_spec
from tests.resources.test_yarn import wait_for

pytestmark = pytest.mark.integration
STALE = HEARTBEAT_SECONDS + 1.5  # the trainer side: a missed beat and a half (HDFS writes are quick here)


def _job(tmp_path, yarn_cluster, kafka_broker, topic, **executor):
    """The demo job on the test YARN cluster, its state on HDFS, its stream executors (``executor``:
    more of their role's fields) reading ``topic``."""
    stream = kafka_stream(kafka_broker.bootstrap, topic, group_id=f"g-{topic}")
    roles = {**DEMO_ROLES, "stream_executor": {"replicas": 2, "memory": "512Mi", "max_restarts": 3, **executor}}
    roles = {name: {"image": "primus-trainer:latest", **role} for name, role in roles.items()}  # the check wants one
    doc = demo_doc(
        f"file://{tmp_path}/data",
        hours=3,
        rows_per_shard=100,
        name=f"yx-{uuid.uuid4().hex[:6]}",
        stream=stream,
        storage={"root": yarn_cluster.hdfs.uri(f"/primus-{uuid.uuid4().hex[:8]}")},
        backend="yarn",
        resources={"clusters": [{"name": "mini", "backend": "yarn", "resource_manager": yarn_cluster.rm_url}]},
        roles=roles,
    )
    spec = write_spec(tmp_path / "job.yaml", doc)
    return str(spec), load_job(spec, env={})


def test_yarn_executors_are_found_through_the_shared_state_on_hdfs(yarn_cluster, kafka_broker, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    topic = kafka_broker.new_topic(partitions=4)
    produced = _produce(kafka_broker, topic, 800, 4, seed=11)
    spec, job = _job(tmp_path, yarn_cluster, kafka_broker, topic)
    assert isinstance(discovery_for(job, "realtime"), SharedStateDiscovery)
    discovery = SharedStateDiscovery(SharedStateDiscovery.for_stream(job, "realtime").directory, stale=STALE)
    backend = YarnBackend(job, spec, roles=["stream_executor"])
    try:
        started = time.monotonic()
        backend.submit()
        found = wait_for(lambda: len(e := discovery.entries()) == 2 and e, 120, "two executors on HDFS")
        print(f"\nboth YARN executors announced on HDFS {time.monotonic() - started:.1f}s after submit")
        assert all(not e["location"].startswith("grpc://0.0.0.0") for e in found.values())
        reader = ExecutorStreamReader(discovery, pull_rows=256)
        try:
            ids = _pull(reader, len(produced), timeout=90)
        finally:
            reader.close()
        assert sorted(ids) == sorted(produced) and _once(ids)

        # a hung executor (SIGSTOP: alive to YARN, no heartbeat) goes stale and is no longer served
        victim = found[1]
        os.kill(int(victim["pid"]), signal.SIGSTOP)
        stopped = time.monotonic()
        wait_for(lambda: sorted(discovery.locations()) == [0], STALE + 5, "the hung executor's entry to go stale")
        print(f"hung executor's entry stale {time.monotonic() - stopped:.1f}s after SIGSTOP")
        killed = time.monotonic()
        os.kill(int(victim["pid"]), signal.SIGKILL)  # kill -9: the AM fails the attempt, YARN starts the next
        again = wait_for(lambda: (e := discovery.entries().get(1)) and e["pid"] != victim["pid"] and e, 120, "restart")
        print(f"restarted executor announced {time.monotonic() - killed:.1f}s after kill -9")
        assert again["location"] != victim["location"] or again["started_at"] > victim["started_at"]
        assert sorted(discovery.locations()) == [0, 1]
        assert backend.status().roles["stream_executor"].restarts >= 1
    finally:
        backend.stop()
    # stopped: no executor is served (a clean stop withdraws its entry; one killed outright goes stale)
    wait_for(lambda: not discovery.entries(), 30, "the entries to be withdrawn", every=0.5)


def test_scaling_yarn_executors_1_to_2_mid_stream_trains_every_sample_once(
    yarn_cluster, kafka_broker, tmp_path, monkeypatch
):
    """The scaler's ``scale`` on YARN starts a second executor application; the trainer side deals
    it half the partitions from its marks: every sample once."""
    from tests.resources.test_executor_scaling import dealt, pull_until

    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    topic = kafka_broker.new_topic(partitions=4)
    everything = {f"{topic}/{p}" for p in range(4)}
    produced = _produce(kafka_broker, topic, 800, 4, seed=31)
    spec, job = _job(tmp_path, yarn_cluster, kafka_broker, topic, replicas=1, min_replicas=1, max_replicas=2)
    discovery = SharedStateDiscovery(SharedStateDiscovery.for_stream(job, "realtime").directory, stale=STALE)
    backend = YarnBackend(job, spec, roles=["stream_executor"])
    reader = ExecutorStreamReader(discovery, buffer_rows=200, pull_rows=50, takeover_after=STALE)
    ids: list[str] = []
    try:
        backend.submit()
        wait_for(lambda: len(discovery.entries()) == 1, 120, "one executor on HDFS")
        ids += _pull(reader, 300, timeout=90)
        reader.commit(reader.position())
        backend.scale("stream_executor", 2)
        more = _produce(kafka_broker, topic, 400, 4, seed=32, prefix="more-")  # waits in executor 0's buffer
        wait_for(lambda: len(discovery.entries()) == 2, 120, "the second executor on HDFS")
        pull_until(reader, ids, dealt(reader, 2, everything), "two executors sharing the partitions")
        ids += _pull(reader, len(produced) + len(more) - len(ids), timeout=90)
        assert _pull(reader, 1, timeout=2.0) == []
        assert reader.position() == {f"{topic}/{p}": 300 for p in range(4)} and reader.assignments >= 1
    finally:
        reader.close()
        backend.stop()
    assert sorted(ids) == sorted(produced + more) and _once(ids)
