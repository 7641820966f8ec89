"""Bad streams against a real Kafka broker: hostile messages are dead-lettered and counted and
the stream goes on; a deleted topic is a clear error; a partition added while reading is read.

Malformed JSON and a missing required field are tests/data/test_kafka.py's; here: an oversized
message (on a topic that allows it), wrong types, bytes that are not UTF-8, JSON that is not an
object, and the topic itself changing under the reader: a deleted topic is reported, and an added
partition's rows are read, within ``NOTICED_S`` of the change (asserted with ``MARGIN_S``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from primus_lib.data.sources import open_stream
from primus_lib.data.sources.deadletter import KEEP_BYTES
from primus_lib.data.sources.kafka import PARTITION_CHECK_S, KafkaStreamReader
from tests.data.test_replay import _events
from tests.fixtures.specs import demo_doc, load, write_spec

pytestmark = pytest.mark.integration

BIG = 4 << 20  # the test topic's own message size limit: the broker takes what the reader must refuse
# docs/reliability.md's claim: a reader asks for the topic's metadata every PARTITION_CHECK_S, so it
# sees a deleted topic or an added partition at its first poll after that (a poll waits <= 0.5 s here)
NOTICED_S = PARTITION_CHECK_S
MARGIN_S = 5.0  # a loaded 2-core machine: the broker's metadata, the poll's timeout, scheduling


def _job(tmp_path, broker, topic):
    doc = demo_doc(f"file://{tmp_path}/data", hours=3, rows_per_shard=100, bootstrap=broker.bootstrap, topic=topic)
    return load(doc, storage=tmp_path / "jobs")  # the demo's stream reads its topic from the earliest offset


def _reader(tmp_path, broker, topic) -> KafkaStreamReader:
    job = _job(tmp_path, broker, topic)
    stream = job.stream("realtime")
    return open_stream(job, stream, stream.sources[0])  # type: ignore[return-value]


def _read(reader, want: int, timeout: float = 30.0, malformed: int = 0) -> list[str]:
    rows, deadline = [], time.monotonic() + timeout
    while (len(rows) < want or reader.malformed < malformed) and time.monotonic() < deadline:
        batch = reader.poll(500, 0.5)
        if batch is not None:
            rows.extend(batch.column("request_id").to_pylist())
    return rows


def _produce(broker, topic: str, values: list[bytes], partition: int | None = None) -> None:
    producer = Producer(broker.config({"message.max.bytes": BIG, "linger.ms": 5}))
    for value in values:
        producer.produce(topic, value, **({"partition": partition} if partition is not None else {}))
    assert producer.flush(15) == 0


def _big_topic(broker) -> str:
    name = broker.new_topic(prefix="big")
    admin = AdminClient(broker.config())
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    entry = ConfigEntry("max.message.bytes", str(BIG), incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", name, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(15)
    return name


def _dead_letters(broker, topic: str, count: int) -> list:
    dlq = Consumer(broker.config({"group.id": "dlq-check", "auto.offset.reset": "earliest"}))
    dlq.assign([TopicPartition(f"{topic}.dlq", 0, 0)])
    letters, deadline = [], time.monotonic() + 15
    while len(letters) < count and time.monotonic() < deadline:
        letters += [m for m in dlq.consume(10, 0.5) if m.error() is None]
    dlq.close()
    return letters


def _sample(**change) -> bytes:
    event = _events(1)[0]
    return json.dumps({**event, "request_id": "bad", **change}).encode()


OVERSIZED = b'{"request_id": "' + b"x" * (2 << 20) + b'"}'
HOSTILE = [  # (case, the message, what its dead letter's reason says)
    ("oversized", OVERSIZED, f"oversized: {len(OVERSIZED)} bytes, more than 1048576"),
    ("timestamp-not-a-time", _sample(ts="yesterday"), "ts"),
    ("label-not-a-number", _sample(clicked="yes"), "clicked"),
    ("sparse-id-an-object", _sample(user_id={"nested": 1}), "user_id"),
    ("not-utf8", b"\xff\xfe\x00\x01binary", "not JSON"),
    ("json-not-an-object", b"[1, 2, 3]", "expected a JSON object, found list"),
    ("null-label", _sample(clicked=None), "null or missing required field"),
]


def test_hostile_messages_are_dead_lettered_counted_and_the_stream_goes_on(kafka_broker, tmp_path):
    topic = _big_topic(kafka_broker)
    good = _events(30)
    values = [json.dumps(e).encode() for e in good[:10]]
    for _, message, _ in HOSTILE:
        values += [message]
    values += [json.dumps(e).encode() for e in good[10:]]
    _produce(kafka_broker, topic, values)
    reader = _reader(tmp_path, kafka_broker, topic)
    try:
        rows = _read(reader, len(good), malformed=len(HOSTILE))
        assert sorted(rows) == sorted(e["request_id"] for e in good)  # nothing good lost, nothing bad kept
        assert reader.malformed == len(HOSTILE)
        assert reader.position() == {f"{topic}/0": len(values)}
        reader.commit(reader.position())  # flushes the dead letters: the oversized one must fit the DLQ
    finally:
        reader.close()
    letters = _dead_letters(kafka_broker, topic, len(HOSTILE))
    assert len(letters) == len(HOSTILE)
    by_offset = {int(dict(m.headers())["primus.origin"].decode().rpartition("@")[2]): m for m in letters}
    for i, (case, message, says) in enumerate(HOSTILE):
        letter = by_offset[10 + i]
        reason = dict(letter.headers())["primus.error"].decode()
        assert says in reason, (case, reason)
        assert letter.value() == message[:KEEP_BYTES], case
    assert "cut to its first" in dict(by_offset[10].headers())["primus.error"].decode()


def test_a_deleted_topic_is_a_clear_error(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(prefix="gone")
    kafka_broker.produce(topic, [json.dumps(e).encode() for e in _events(5)])
    reader = _reader(tmp_path, kafka_broker, topic)
    try:
        assert len(_read(reader, 5)) == 5
        admin = AdminClient(kafka_broker.config())
        for future in admin.delete_topics([topic]).values():
            future.result(15)
        deleted, error = time.monotonic(), None
        try:
            while time.monotonic() - deleted < NOTICED_S + MARGIN_S:
                reader.poll(100, 0.5)
        except Exception as exc:
            error = exc
        noticed = time.monotonic() - deleted
    finally:
        reader.close()
    assert error is not None, f"no error {noticed:.1f} s after the topic was deleted"
    assert f"topic '{topic}' no longer exists at {kafka_broker.bootstrap} (deleted?)" in str(error), error
    print(f"\ndeleted topic reported {noticed:.1f} s after the deletion (claim {NOTICED_S:.0f} s)")
    assert noticed < NOTICED_S + MARGIN_S, noticed


def test_a_partition_added_while_reading_is_picked_up(kafka_broker, tmp_path):
    topic = kafka_broker.new_topic(partitions=1, prefix="grow")
    first, later = _events(20)[:10], _events(20)[10:]
    kafka_broker.produce(topic, [json.dumps(e).encode() for e in first], partition=0)
    reader = _reader(tmp_path, kafka_broker, topic)
    try:
        assert len(_read(reader, 10)) == 10
        admin = AdminClient(kafka_broker.config())
        for future in admin.create_partitions([NewPartitions(topic, 2)]).values():
            future.result(15)
        added = time.monotonic()
        deadline = time.monotonic() + 15
        while len(admin.list_topics(topic, timeout=5).topics[topic].partitions) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        kafka_broker.produce(topic, [json.dumps(e).encode() for e in later], partition=1)
        rows = _read(reader, 1, timeout=NOTICED_S + MARGIN_S - (time.monotonic() - added))
        noticed = time.monotonic() - added
        assert rows, f"no row of the added partition {noticed:.1f} s after it was added"
        print(f"\nadded partition's first rows read {noticed:.1f} s after it was added (claim {NOTICED_S:.0f} s)")
        assert noticed < NOTICED_S + MARGIN_S, noticed
        rows += _read(reader, 10 - len(rows), timeout=30)
        assert sorted(rows) == sorted(e["request_id"] for e in later)
        assert reader.position() == {f"{topic}/0": 10, f"{topic}/1": 10}
    finally:
        reader.close()


def test_eval_of_a_missing_topic_is_one_line(kafka_broker, tmp_path):
    topic = f"never-created-{os.getpid()}"
    data, storage = f"file://{tmp_path}/data", {"root": str(tmp_path / "jobs")}
    doc = demo_doc(data, hours=2, rows_per_shard=100, bootstrap=kafka_broker.bootstrap, topic=topic, storage=storage)
    spec = write_spec(tmp_path / "job.yaml", doc)
    from tests.data.helpers import write_layout

    write_layout(tmp_path / "data", hours=2, rows=20, files=1)
    command = [
        sys.executable,
        "-m",
        "primus_lib.cli.main",
        "eval",
        str(spec),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
        "--modes",
        "online",
        "--seeds",
        "0",
        "--eval-from",
        "2026-11-01T01:00:00Z",
    ]
    env = {**os.environ, "PRIMUS_HOME": str(tmp_path / "home")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"primus eval: kafka topic '{topic}' at {kafka_broker.bootstrap}")
    assert "not found" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()  # nothing half-made: no --out at all
