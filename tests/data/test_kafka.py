"""Kafka stream source against a real Apache Kafka broker (KRaft, tests/fixtures/kafka.py)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from confluent_kafka import Consumer, TopicPartition

from primus_lib.data.buffer import SampleBuffer
from primus_lib.data.executor.stream import StreamGroup
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.sources import open_partitions, open_stream
from primus_lib.paths import JobPaths
from tests.data.helpers import T0
from tests.data.test_replay import _events
from tests.fixtures.specs import demo_doc, kafka_stream, load

pytestmark = pytest.mark.integration


def _job(tmp_path, broker, topic, **kafka):
    stream = kafka_stream(broker.bootstrap, topic, **kafka)
    return load(
        demo_doc(f"file://{tmp_path}/data", hours=3, rows_per_shard=100, stream=stream), storage=tmp_path / "jobs"
    )


def _drain(reader, want: int, timeout: float = 20.0) -> list:
    rows, deadline = [], time.monotonic() + timeout
    while len(rows) < want and time.monotonic() < deadline:
        batch = reader.poll(500, 0.5)
        if batch is not None:
            rows.extend(batch.column("request_id").to_pylist())
    return rows


def _values(events) -> list[bytes]:
    return [json.dumps(e).encode() for e in events]


def test_earliest_reads_every_partition_and_dead_letters_malformed(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=2)
    events = _events(40)
    kafka_broker.produce(topic, _values(events[:20]) + [b"{broken"], partition=0)
    kafka_broker.produce(topic, _values(events[20:]) + [json.dumps({"request_id": "no-ts"}).encode()], partition=1)
    job = _job(tmp_path, kafka_broker, topic, startup="earliest")
    stream = job.stream("realtime")
    reader = open_stream(job, stream, stream.sources[0])
    try:
        rows = _drain(reader, 40)
        deadline = time.monotonic() + 10
        while reader.malformed < 2 and time.monotonic() < deadline:
            reader.poll(500, 0.5)
        assert sorted(rows) == sorted(e["request_id"] for e in events)
        assert reader.malformed == 2  # counted, not dropped
        assert reader.position() == {f"{topic}/0": 21, f"{topic}/1": 21}
        reader.commit(reader.position())  # flushes the dead letters first
    finally:
        reader.close()
    dlq = Consumer(kafka_broker.config({"group.id": "dlq-check", "auto.offset.reset": "earliest"}))
    dlq.assign([TopicPartition(f"{topic}.dlq", 0, 0)])
    letters = []
    deadline = time.monotonic() + 15
    while len(letters) < 2 and time.monotonic() < deadline:
        letters += [m for m in dlq.consume(10, 0.5) if m.error() is None]
    dlq.close()
    assert sorted(m.value() for m in letters) == sorted([b"{broken", json.dumps({"request_id": "no-ts"}).encode()])
    headers = dict(letters[0].headers())
    assert b"@" in headers["primus.origin"] and headers["primus.error"]


def test_partition_ends_and_line_breaks_among_messages_lose_and_repeat_nothing(kafka_broker, tmp_path):
    """The reader takes a block's fields list by list: the partition-end events librdkafka mixes in
    (``enable.partition.eof``) are set aside, a pretty-printed message (line breaks of its own) is
    one sample, and each row keeps its own partition and offset."""
    topic = kafka_broker.new_topic(partitions=2)
    events = _events(60, seed=11)
    values = _values(events)
    values[7] = json.dumps(events[7], indent=2).encode()  # its line breaks must not split it
    kafka_broker.produce(topic, values[:30], partition=0)
    kafka_broker.produce(topic, values[30:] + [b"{broken"], partition=1)
    job = _job(tmp_path, kafka_broker, topic, startup="earliest", options={"enable.partition.eof": "true"})
    stream = job.stream("realtime")
    reader = open_stream(job, stream, stream.sources[0])
    rows, tags = [], []
    try:
        deadline = time.monotonic() + 20
        while (len(rows) < 60 or reader.malformed < 1) and time.monotonic() < deadline:
            batch = reader.poll(500, 0.5)
            if batch is not None:
                rows += batch.column("request_id").to_pylist()
                keys, offsets = reader.last_offsets
                assert len(keys) == len(offsets) == batch.num_rows
                tags += list(zip(keys, offsets.tolist(), strict=True))
        assert sorted(rows) == sorted(e["request_id"] for e in events)
        assert reader.malformed == 1
        assert reader.position() == {f"{topic}/0": 30, f"{topic}/1": 31}
    finally:
        reader.close()
    by_id = dict(zip(rows, tags, strict=True))
    for i, event in enumerate(events):  # the row of message i came from its own partition and offset
        assert by_id[event["request_id"]] == ((f"{topic}/0", i) if i < 30 else (f"{topic}/1", i - 30))


def test_at_the_live_edge_a_poll_waits_within_its_timeout_for_a_fuller_block(kafka_broker, tmp_path):
    """A block of a few rows costs an executor as much as one of thousands: where little is queued a
    poll waits (within its timeout) for more rather than return each message as its own block.
    (Behind the stream it returns what is queued at once: bench/stream.py measures that.)"""
    topic = kafka_broker.new_topic(partitions=1)
    events = _events(6, seed=17)
    job = _job(tmp_path, kafka_broker, topic, startup="earliest")
    stream = job.stream("realtime")
    reader = open_stream(job, stream, stream.sources[0])
    try:
        assert reader.poll(100, 0.5) is None  # nothing there yet: librdkafka has fetched the empty topic
        kafka_broker.produce(topic, _values(events[:3]), partition=0)
        later = threading.Timer(0.3, kafka_broker.produce, (topic, _values(events[3:6])), {"partition": 0})
        later.start()
        try:
            batch = reader.poll(100, 3.0)
        finally:
            later.join()
        assert batch is not None and batch.column("request_id").to_pylist() == [e["request_id"] for e in events]
    finally:
        reader.close()


def test_a_seek_to_where_the_reader_is_keeps_its_assignment(kafka_broker, tmp_path):
    """Reassigning drops what librdkafka fetched ahead: a seek to the reader's own position (a
    trainer attaching to a fresh executor) keeps the consumer as it is; a seek elsewhere rewinds."""
    topic = kafka_broker.new_topic(partitions=1)
    events = _events(20, seed=13)
    kafka_broker.produce(topic, _values(events), partition=0)
    job = _job(tmp_path, kafka_broker, topic, startup="earliest")
    stream = job.stream("realtime")
    reader = open_stream(job, stream, stream.sources[0])
    assigned = []

    class Watched:  # the consumer, with its assign calls counted
        def __init__(self, consumer):
            self.consumer = consumer

        def assign(self, partitions):
            assigned.append([(tp.partition, tp.offset) for tp in partitions])
            return self.consumer.assign(partitions)

        def __getattr__(self, name):
            return getattr(self.consumer, name)

    reader.consumer = Watched(reader.consumer)
    try:
        reader.seek({f"{topic}/0": 0})
        assert assigned == []
        first, deadline = [], time.monotonic() + 20
        while len(first) < 8 and time.monotonic() < deadline:
            batch = reader.poll(8 - len(first), 0.5)
            first += [] if batch is None else batch.column("request_id").to_pylist()
        reader.seek(reader.position())
        assert assigned == []
        rest = _drain(reader, 20 - len(first))
        assert first + rest == [e["request_id"] for e in events]  # nothing lost, nothing twice
        reader.seek({f"{topic}/0": 5})
        assert assigned == [[(0, 5)]]
        assert _drain(reader, 15) == [e["request_id"] for e in events[5:]]
    finally:
        reader.consumer = reader.consumer.consumer
        reader.close()


def test_group_offsets_resume_exactly_after_the_committed_rows(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=1)
    events = _events(30, seed=5)
    kafka_broker.produce(topic, _values(events), partition=0)
    job = _job(tmp_path, kafka_broker, topic, startup="group_offsets", group_id="g-resume")
    stream = job.stream("realtime")
    first = open_stream(job, stream, stream.sources[0])
    buffer = SampleBuffer(1000)
    deadline = time.monotonic() + 20
    while len(buffer) < 30 and time.monotonic() < deadline:
        batch = first.poll(500, 0.5)
        if batch is not None:
            buffer.put(batch, first.last_offsets)
    trained = buffer.pop(12).column("request_id").to_pylist()  # the checkpoint covers 12 rows
    first.commit(buffer.consumed_position())
    first.close()
    second = open_stream(job, stream, stream.sources[0])
    try:
        rest = _drain(second, 18)
    finally:
        second.close()
    assert trained + rest == [e["request_id"] for e in events]  # nothing lost, nothing twice


def test_one_stream_task_per_partition_feeding_executors(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=3)
    events = _events(90, seed=9)
    for p in range(3):
        kafka_broker.produce(topic, _values(events[p * 30 : (p + 1) * 30]), partition=p)
    job = _job(tmp_path, kafka_broker, topic, startup="earliest")
    stream = job.stream("realtime")
    readers = open_partitions(job, stream, stream.sources[0])
    assert sorted(readers) == [f"{topic}/{p}" for p in range(3)]
    buffers = [SampleBuffer(1000), SampleBuffer(1000)]
    ledger = TaskLedger(JobPaths.for_job(job).ledger)
    group = StreamGroup(readers, buffers, mode="rebalance", poll_rows=16, ledger=ledger, stream="realtime").start()
    assert ledger.stream_assignments("realtime") == {
        f"{topic}/0": "realtime-executor-0",
        f"{topic}/1": "realtime-executor-1",
        f"{topic}/2": "realtime-executor-0",
    }
    try:
        deadline = time.monotonic() + 30
        while sum(b.rows_in for b in buffers) < 90 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        group.stop()
    popped = [b.pop(1000, timeout=0.1) for b in buffers]
    got = [r for batch in popped if batch is not None for r in batch.column("request_id").to_pylist()]
    assert sorted(got) == sorted(e["request_id"] for e in events) and not group.errors()
    assert set(ledger.stream_assignments("realtime").values()) == {None}
    for reader in readers.values():
        reader.close()


def test_latest_skips_what_was_there_before(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=1)
    old, new = _events(10, seed=1), _events(10, seed=2)
    kafka_broker.produce(topic, _values(old), partition=0)
    job = _job(tmp_path, kafka_broker, topic, startup="latest")
    stream = job.stream("realtime")
    reader = open_stream(job, stream, stream.sources[0])
    try:
        assert reader.position() == {f"{topic}/0": 10}  # resolved at open: the high watermark
        kafka_broker.produce(topic, _values(new), partition=0)
        rows = _drain(reader, 10, timeout=10)
        assert reader.position() == {f"{topic}/0": 20}
    finally:
        reader.close()
    assert sorted(rows) == sorted(e["request_id"] for e in new)


def test_timestamp_startup_begins_at_the_first_message_at_or_after_it(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=2)
    events = _events(20, seed=4)
    base = int(T0.timestamp() * 1000)
    kafka_broker.produce(topic, _values(events), partition=0, timestamps=[base + i * 60_000 for i in range(20)])
    kafka_broker.produce(topic, _values(_events(3, seed=6)), partition=1, timestamps=[base] * 3)
    # between two messages' timestamps: the first one after it (minute 12) is where reading starts
    start = T0 + timedelta(minutes=11, seconds=30)
    job = _job(
        tmp_path, kafka_broker, topic, startup="timestamp", startup_timestamp=start.strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    stream = job.stream("realtime")
    reader = open_stream(job, stream, stream.sources[0])
    try:
        # partition 1 has nothing that new: it starts at its end, like Kafka's --to-datetime reset
        assert reader.position() == {f"{topic}/0": 12, f"{topic}/1": 3}
        rows = _drain(reader, 8, timeout=10)
        assert reader.poll(100, 1.0) is None  # nothing before the timestamp arrives late
    finally:
        reader.close()
    assert rows == [e["request_id"] for e in events[12:]]


def test_lag_is_the_high_watermark_minus_the_position(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=2)
    events = _events(50, seed=8)
    kafka_broker.produce(topic, _values(events[:30]), partition=0)
    kafka_broker.produce(topic, _values(events[30:]), partition=1)
    job = _job(tmp_path, kafka_broker, topic, startup="earliest")
    stream = job.stream("realtime")
    reader = open_stream(job, stream, stream.sources[0], partitions=[0])
    try:
        assert reader.lag() == {f"{topic}/0": 30}  # only its own partitions
        rows = []
        while len(rows) < 12:
            batch = reader.poll(12 - len(rows), 1.0)
            rows += [] if batch is None else batch.column("request_id").to_pylist()
        assert reader.lag() == {f"{topic}/0": 30 - 12}
        kafka_broker.produce(topic, _values(_events(5, seed=11)), partition=0)
        assert reader.lag() == {f"{topic}/0": 30 - 12 + 5}  # new messages raise it at once
        _drain(reader, 30 + 5 - 12)
        assert reader.lag() == {f"{topic}/0": 0}
    finally:
        reader.close()


def test_lag_asks_the_broker_twice_for_all_partitions_not_twice_a_partition(kafka_broker, tmp_path, monkeypatch):
    """An executor reports its lag every second at a short ``scaling.interval``: the ListOffsets
    requests librdkafka itself counts (its statistics) stay two a call whatever the partitions.
    Records deleted below the position (retention) and an empty partition read right."""
    from confluent_kafka import TopicPartition as TP
    from confluent_kafka.admin import AdminClient

    from primus_lib.data.sources import kafka as kafka_source

    topic = kafka_broker.new_topic(partitions=8)
    for p in range(7):  # partition 7 stays empty
        kafka_broker.produce(topic, _values(_events(10 + p, seed=p)), partition=p)
    stats: list[dict] = []

    def counting(config):
        return Consumer({**config, "statistics.interval.ms": 100, "stats_cb": lambda s: stats.append(json.loads(s))})

    monkeypatch.setattr(kafka_source, "Consumer", counting)
    job = _job(tmp_path, kafka_broker, topic, startup="earliest")
    stream = job.stream("realtime")
    reader = open_stream(job, stream, stream.sources[0])

    def list_offsets_requests() -> int:
        """The count in a report made after now (its ``ts`` is librdkafka's CLOCK_MONOTONIC, in us)."""
        now, deadline = time.monotonic(), time.monotonic() + 10
        while not (stats and stats[-1]["ts"] / 1e6 > now) and time.monotonic() < deadline:
            reader.consumer.poll(0.05)  # statistics arrive through the consumer's callbacks
        assert stats and stats[-1]["ts"] / 1e6 > now, "librdkafka sent no statistics"
        # a report holds the cumulative counts; the bootstrap broker's entry counts too
        return sum(b["req"].get("ListOffsets", 0) for b in stats[-1]["brokers"].values())

    try:
        before = list_offsets_requests()
        for _ in range(5):
            lags = reader.lag()
        assert lags == {f"{topic}/{p}": 10 + p for p in range(7)} | {f"{topic}/7": 0}
        assert list_offsets_requests() - before == 2 * 5  # was 2 x 8 partitions a call
        admin = AdminClient(kafka_broker.config())
        for future in admin.delete_records([TP(topic, 0, 4)]).values():
            future.result()  # retention removed offsets 0-3 of partition 0, not read yet
        assert reader.lag()[f"{topic}/0"] == 10 - 4
    finally:
        reader.close()


def test_connection_settings_from_a_mounted_secret_reach_the_consumer(kafka_broker, tmp_path, monkeypatch):
    """A role process resolves ``kafka.connection_id`` from $PRIMUS_SECRETS_DIR/<id>.json (what the
    Airflow connection holds); here the spec names a dead address and only the connection's
    bootstrap list is right."""
    from primus_lib.data.sources.kafka import client_config

    topic = kafka_broker.new_topic(partitions=1)
    events = _events(5)
    kafka_broker.produce(topic, _values(events), partition=0)
    job = _job(
        tmp_path, kafka_broker, topic, startup="earliest", bootstrap_servers="127.0.0.1:1", connection_id="events"
    )
    stream = job.stream("realtime")
    source = stream.sources[0]
    secrets = tmp_path / "secrets"  # the kafka_broker fixture's
    conn = kafka_broker.connection(host=kafka_broker.bootstrap, port=None)
    conn["extra"] = {**conn["extra"], "config": {"client.id": "from-conn"}}
    (secrets / "events.json").write_text(json.dumps(conn))
    monkeypatch.setenv("PRIMUS_KAFKA_CONFIG_REALTIME_EVENTS", json.dumps({"client.id": "from-env"}))  # never read
    monkeypatch.setenv("PRIMUS_SECRETS_DIR", str(secrets))
    assert client_config(stream, source)["client.id"] == "from-conn"
    readers = open_partitions(job, stream, source)
    try:
        (reader,) = readers.values()
        assert sorted(_drain(reader, 5)) == sorted(e["request_id"] for e in events)
    finally:
        for reader in readers.values():
            reader.close()
    (secrets / "events.json").write_text("not json")
    with pytest.raises(ValueError, match=r"events.json: expected a JSON connection object, not valid JSON"):
        client_config(stream, source)
    (secrets / "events.json").unlink()
    with pytest.raises(ValueError, match=r"sources\[events\].kafka.connection_id 'events': not found"):
        client_config(stream, source)


def test_group_commits_of_disjoint_readers_survive_a_broker_restart(kafka_broker, tmp_path):
    """Two readers of one group (two ranks) commit their own partitions; the committed offsets
    are the group's at the broker, through a clean broker restart, and resume each reader."""
    topic = kafka_broker.new_topic(partitions=2)
    events = _events(40, seed=12)
    kafka_broker.produce(topic, _values(events[:20]), partition=0)
    kafka_broker.produce(topic, _values(events[20:]), partition=1)
    job = _job(tmp_path, kafka_broker, topic, startup="group_offsets", group_id="g-ranks")
    stream = job.stream("realtime")
    readers = [open_stream(job, stream, stream.sources[0], partitions=[p]) for p in (0, 1)]
    try:
        assert [r.position() for r in readers] == [{f"{topic}/0": 0}, {f"{topic}/1": 0}]  # none committed
        assert [len(_drain(r, 20)) for r in readers] == [20, 20]
        checkpoint = {f"{topic}/0": 15, f"{topic}/1": 7}
        for reader in readers:
            reader.commit(checkpoint)  # each commits only the partitions it reads
    finally:
        for reader in readers:
            reader.close()

    kafka_broker.restart()
    resumed = [open_stream(job, stream, stream.sources[0], partitions=[p]) for p in (0, 1)]
    try:
        assert [r.position() for r in resumed] == [{f"{topic}/0": 15}, {f"{topic}/1": 7}]
        assert _drain(resumed[0], 5) == [e["request_id"] for e in events[15:20]]
        assert _drain(resumed[1], 13) == [e["request_id"] for e in events[27:]]
        assert [r.lag() for r in resumed] == [{f"{topic}/0": 0}, {f"{topic}/1": 0}]
    finally:
        for reader in resumed:
            reader.close()
