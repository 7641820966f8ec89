"""Scaling the stream executors mid-stream on the local backend (real supervisor, real ``primus
executor`` subprocesses, a real Kafka): 2 -> 3 -> 1 executors while the "trainer" pulls, checkpoints
and commits; partition ownership follows the membership and every sample is trained exactly once."""

from __future__ import annotations

import sys
import time

import pytest

from primus_lib.data.flight_client import ExecutorStreamReader
from primus_lib.resources import backend_for
from primus_lib.resources.discovery import LocalDiscovery
from tests.data.test_stream_executor import _committed, _once, _produce, _pull, _spec

pytestmark = pytest.mark.integration
SMALL = ["--buffer-rows", "300", "--poll-rows", "100"]  # executors stay mid-stream: most rows wait in Kafka


def shares(reader: ExecutorStreamReader) -> dict[int, set[str]]:
    return {i: set(s["partitions"]) for i, s in reader.executor_stats().items()}


def pull_until(reader: ExecutorStreamReader, ids: list[str], done, what: str, timeout: float = 60.0) -> None:
    """Keep training (a few rows at a time) until ``done()``."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}: {shares(reader)}, {len(ids)} rows")
        ids += _pull(reader, 20, timeout=0.5)
        time.sleep(0.1)  # a slow trainer: the executors' buffers stay full


def dealt(reader: ExecutorStreamReader, executors: int, partitions: set[str]):
    """Each of ``executors`` serves its own, disjoint share and together all partitions."""

    def check() -> bool:
        try:
            got = shares(reader)
        except Exception:
            return False
        sets = list(got.values())
        return (
            len(got) == executors
            and set().union(*sets) == partitions
            and sum(map(len, sets)) == len(partitions)
            and max(map(len, sets)) - min(map(len, sets)) <= 1
        )

    return check


def test_scaling_the_executors_2_3_1_mid_stream_trains_every_sample_once(kafka_broker, tmp_path, monkeypatch):
    topic = kafka_broker.new_topic(partitions=6)
    everything = {f"{topic}/{p}" for p in range(6)}
    produced = _produce(kafka_broker, topic, 3000, 6, seed=21)
    executor = [sys.executable, "-m", "primus_lib.cli.main", "executor", "{SPEC}", *SMALL]
    sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
    roles = {
        "stream_executor": {"replicas": 2, "min_replicas": 1, "max_replicas": 3, "command": executor},
        "trainer": {"command": sleep},
        "data_executor": {"replicas": 1},
    }
    spec, job = _spec(tmp_path, kafka_broker, topic, roles=roles)
    backend = backend_for(job, str(spec))
    discovery = LocalDiscovery.for_stream(job, "realtime")
    backend.submit()
    reader = ExecutorStreamReader(discovery, buffer_rows=400, pull_rows=100, takeover_after=1.0)
    ids: list[str] = []
    try:
        pull_until(reader, ids, lambda: len(discovery.locations()) == 2 and len(ids) >= 600, "two executors")
        assert dealt(reader, 2, everything)()
        checkpoint = reader.position()  # the trainer's checkpoint, then its commit
        reader.commit(checkpoint)

        backend.scale("stream_executor", 3)
        pull_until(reader, ids, dealt(reader, 3, everything), "three executors sharing the partitions")
        assert len(ids) < len(produced)  # still mid-stream
        more = _produce(kafka_broker, topic, 3000, 6, seed=22, prefix="more-")
        first = len(ids)
        pull_until(reader, ids, lambda: len(ids) >= first + 300, "rows from three executors")

        backend.scale("stream_executor", 1)  # two executors stop with rows in their buffers
        pull_until(reader, ids, dealt(reader, 1, everything), "one executor serving everything")
        assert len(ids) < len(produced) + len(more)
        ids += _pull(reader, len(produced) + len(more) - len(ids))
        assert _pull(reader, 1, timeout=2.0) == []  # nothing more
        assert reader.takeovers == 2 and reader.assignments >= 3
        final = reader.position()
        assert final == {f"{topic}/{p}": 1000 for p in range(6)}
        reader.commit(final)  # the one executor left commits all six partitions
        assert _committed(kafka_broker, topic, f"g-{topic}", 6) == final
    finally:
        reader.close()
        backend.stop()
    trained = sorted(ids)
    assert len(trained) == len(produced) + len(more)
    assert trained == sorted(produced + more) and _once(ids)
    print(f"\nscaled 2 -> 3 -> 1: {len(ids)} samples trained once each, {reader.duplicates} replays dropped")
