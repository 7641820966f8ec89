"""A partition added to the topic while two real ``primus executor`` processes serve it and a
trainer's reader pulls (real Kafka): exactly one executor serves it, from its first offset (also
under ``startup: latest``: everything a new partition holds is new), within ``PICKED_UP_S`` of the
partition being added (asserted with ``MARGIN_S``), and every row, old partitions' and new, is
trained exactly once; in forward and in rebalance mode."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from primus_lib.data.flight_client import ExecutorStreamReader
from primus_lib.data.sources.kafka import PARTITION_CHECK_S
from primus_lib.resources.discovery import LocalDiscovery
from tests.data.test_replay import _events
from tests.data.test_stream_executor import _committed, _once, _produce, _pull, _spec, executors  # noqa: F401
from tests.data.test_stream_rebalance import _pull_both

pytestmark = pytest.mark.integration
SMALL = ("--buffer-rows", "300", "--poll-rows", "100")
UNIVERSE_EVERY_S = 1.0  # ExecutorStreamReader's default: how often it asks its executors for partitions
# docs/reliability.md's claim: an executor's reader sees a new partition at its next metadata check,
# the trainer's reader asks for it within a second and deals it; its first rows come with one pull
PICKED_UP_S = PARTITION_CHECK_S + UNIVERSE_EVERY_S
MARGIN_S = 5.0  # a loaded 2-core machine: the broker's metadata, a pull's timeout, scheduling


def _add_partition(broker, topic: str, total: int) -> float:
    """Grow ``topic`` to ``total`` partitions; the monotonic time the broker answered it had."""
    admin = AdminClient(broker.config())
    for future in admin.create_partitions([NewPartitions(topic, total)]).values():
        future.result(15)
    added = time.monotonic()
    deadline = time.monotonic() + 15
    while len(admin.list_topics(topic, timeout=5).topics[topic].partitions) < total:
        assert time.monotonic() < deadline, f"{topic} never showed {total} partitions"
        time.sleep(0.1)
    return added


def _produce_to(broker, topic: str, partition: int, n: int) -> list[str]:
    events = _events(n, seed=29)
    for event in events:
        event["request_id"] = f"new-{event['request_id']}"
    broker.produce(topic, [json.dumps(e).encode() for e in events], partition=partition)
    return [e["request_id"] for e in events]


def _shares(reader: ExecutorStreamReader) -> list[set[str]]:
    return [set(s["partitions"]) for s in reader.executor_stats().values()]


def test_a_partition_added_while_serving_is_dealt_to_one_executor_from_its_first_offset(
    kafka_broker,
    tmp_path,
    executors,  # noqa: F811
):
    topic = kafka_broker.new_topic(partitions=2)
    spec, job = _spec(tmp_path, kafka_broker, topic, startup="latest")
    executors(spec, 0, 2, *SMALL)
    executors(spec, 1, 2, *SMALL)
    produced = _produce(kafka_broker, topic, 600, 2, seed=27)  # after the executors resolved "latest"
    reader = ExecutorStreamReader(LocalDiscovery.for_stream(job, "realtime"), buffer_rows=400, pull_rows=100)
    try:
        ids = _pull(reader, 400)
        grown = _add_partition(kafka_broker, topic, 3)
        added = _produce_to(kafka_broker, topic, 2, 300)  # before anyone reads it: from offset 0 or lost
        while not any(i.startswith("new-") for i in ids) and time.monotonic() - grown < PICKED_UP_S + MARGIN_S:
            ids += _pull(reader, 50, timeout=0.5)
        picked_up = time.monotonic() - grown
        assert any(i.startswith("new-") for i in ids), f"no row of the added partition {picked_up:.1f} s after it"
        assert picked_up < PICKED_UP_S + MARGIN_S, picked_up
        ids += _pull(reader, len(produced) + len(added) - len(ids), timeout=60)
        assert _pull(reader, 1, timeout=2.0) == []  # nothing twice
        shares = _shares(reader)
        assert sorted(map(len, shares)) == [1, 2] and set().union(*shares) == {f"{topic}/{p}" for p in range(3)}
        final = reader.position()
        assert final == {f"{topic}/0": 300, f"{topic}/1": 300, f"{topic}/2": 300}
        reader.commit(final)  # the executor that took the new partition commits it too
        assert _committed(kafka_broker, topic, f"g-{topic}", 3) == final
    finally:
        reader.close()
    assert sorted(ids) == sorted(produced + added) and _once(ids)
    print(
        f"\nadded partition's first row served {picked_up:.1f} s after the partition was added "
        f"(claim {PICKED_UP_S:.0f} s, asserted < {PICKED_UP_S + MARGIN_S:.0f} s)"
    )


def test_a_partition_added_under_rebalance_reaches_both_ranks_once(kafka_broker, tmp_path, executors):  # noqa: F811
    topic = kafka_broker.new_topic(partitions=2)
    produced = _produce(kafka_broker, topic, 600, 2, seed=31)
    spec, job = _spec(tmp_path, kafka_broker, topic, shuffle="rebalance")
    executors(spec, 0, 2, *SMALL)
    executors(spec, 1, 2, *SMALL)
    discovery = LocalDiscovery.for_stream(job, "realtime")
    readers = [
        ExecutorStreamReader(discovery, buffer_rows=200, pull_rows=50, rank=r, size=2, shuffle="rebalance")
        for r in range(2)
    ]
    try:
        trained = _pull_both(readers, [200, 200])
        _add_partition(kafka_broker, topic, 3)
        added = _produce_to(kafka_broker, topic, 2, 300)
        for i, more in enumerate(_pull_both(readers, [250, 250])):  # offsets split over the ranks by parity
            trained[i] += more
        assert _pull(readers[0], 1, timeout=2.0) == [] and _pull(readers[1], 1, timeout=2.0) == []
        shares = _shares(readers[0])
        assert sorted(map(len, shares)) == [1, 2] and set().union(*shares) == {f"{topic}/{p}" for p in range(3)}
    finally:
        for reader in readers:
            reader.close()
    assert [len(t) for t in trained] == [450, 450]
    total = trained[0] + trained[1]
    assert sorted(total) == sorted(produced + added) and _once(total)
