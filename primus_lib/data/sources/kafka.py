"""Kafka stream source (confluent-kafka): one reader per set of topic-partitions, decoded to samples.

Start-up modes: ``group_offsets`` (the group's committed offsets; earliest where none),
``earliest``, ``latest``, ``timestamp`` (the first offset at/after ``startup_timestamp``, via
offsets_for_times). Offsets are never auto-committed: ``commit(position)`` is called by the
owner once a checkpoint covers the rows (and dead letters are flushed before). Malformed
messages go to ``<topic>.dlq`` with the reason in a header and are counted.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from primus_lib.data.sources.deadletter import DeadLetters, KafkaDeadLetters
from primus_lib.data.sources.decode import conform
from primus_lib.data.sources.messages import decode_messages
from primus_lib.data.stream import Position, StreamReader
from primus_lib.spec.dataset import SourceSpec, StreamSpec
from primus_lib.spec.job import PrimusJob


def connection_env_key(stream: StreamSpec, source: SourceSpec) -> str:
    """The variable the Airflow hooks fill from ``kafka.connection_id`` (JSON librdkafka settings)."""
    name = f"{stream.name}_{source.name}".upper().replace("-", "_")
    return f"PRIMUS_KAFKA_CONFIG_{name}"


def client_config(stream: StreamSpec, source: SourceSpec) -> dict[str, str]:
    """librdkafka settings of a source: the spec's bootstrap servers, then the connection's
    settings (credentials, and its own bootstrap list if it names one), then ``kafka.options``."""
    assert source.kafka is not None
    config: dict[str, str] = {"bootstrap.servers": source.kafka.bootstrap_servers}
    raw = os.environ.get(connection_env_key(stream, source))
    if raw:
        try:
            from_connection = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"${connection_env_key(stream, source)}: expected a JSON object, found {raw[:40]!r}"
            ) from exc
        config.update({str(k): str(v) for k, v in from_connection.items()})
    config.update(source.kafka.options)
    return config


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def default_group(job: PrimusJob, stream: StreamSpec) -> str:
    return f"primus-{job.name}-{stream.name}"


class KafkaStreamReader(StreamReader):
    def __init__(
        self,
        job: PrimusJob,
        stream: StreamSpec,
        source: SourceSpec,
        *,
        group_id: str | None = None,
        partitions: list[int] | None = None,
        dead_letters: DeadLetters | None = None,
    ):
        if source.kafka is None:
            raise ValueError(f"source {source.name!r} of stream {stream.name!r} has no kafka block")
        self.job, self.stream, self.source, self.spec = job, stream, source, source.kafka
        self.topic = self.spec.topic
        self.group_id = group_id or self.spec.group_id or default_group(job, stream)
        client = client_config(stream, source)
        self.bootstrap = client["bootstrap.servers"]
        config = {
            **client,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "latest" if self.spec.startup == "latest" else "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "fetch.wait.max.ms": 100,
            **self.spec.options,  # the job's explicit settings win over the defaults above
        }
        self.consumer = Consumer(config)
        self.malformed = 0
        self._next: dict[str, int] = {}
        self.last_offsets: tuple[list[str], np.ndarray] = ([], np.empty(0, np.int64))
        try:
            self.partitions = sorted(partitions) if partitions is not None else self._all_partitions()
            self.dead_letters = dead_letters or KafkaDeadLetters(self.bootstrap, f"{self.topic}.dlq", client)
            self.consumer.assign(self._start_offsets())
        except BaseException:  # a reader that failed to open must not leave its consumer behind
            self.consumer.close()
            raise

    def _all_partitions(self) -> list[int]:
        meta = self.consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise KafkaException(f"topic {self.topic!r} not found at {self.bootstrap} ({getattr(meta, 'error', None)})")
        return sorted(meta.partitions)

    def _start_offsets(self) -> list[TopicPartition]:
        tps = [TopicPartition(self.topic, p) for p in self.partitions]
        mode = self.spec.startup
        if mode == "earliest":
            return [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in self.partitions]
        if mode == "latest":
            return [TopicPartition(self.topic, p, OFFSET_END) for p in self.partitions]
        if mode == "timestamp":
            ms = int(self.spec.startup_timestamp.timestamp() * 1000)  # type: ignore[union-attr]
            found = self.consumer.offsets_for_times(
                [TopicPartition(self.topic, p, ms) for p in self.partitions], timeout=10
            )
            out = [
                TopicPartition(self.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END) for tp in found
            ]
        else:  # group_offsets
            committed = self.consumer.committed(tps, timeout=10)
            out = [
                TopicPartition(self.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                for tp in committed
            ]
        for tp in out:
            if tp.offset >= 0:
                self._next[partition_key(self.topic, tp.partition)] = tp.offset
        return out

    def poll(self, max_rows: int, timeout: float) -> pa.RecordBatch | None:
        messages = self.consumer.consume(num_messages=max_rows, timeout=timeout)
        values, keys, offsets = [], [], []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal() or not err.retriable():
                    raise KafkaException(err)
                continue
            key = partition_key(msg.topic(), msg.partition())
            values.append(msg.value() or b"")
            keys.append(key)
            offsets.append(msg.offset())
            self._next[key] = msg.offset() + 1
        if not values:
            self.last_offsets = ([], np.empty(0, np.int64))
            return None
        table, good, bad = decode_messages(self.job, self.stream, self.source, values, f"kafka {self.topic}")
        for item in bad:
            origin = f"{keys[item.index]}@{offsets[item.index]}"
            self.dead_letters.send(values[item.index], item.reason, origin)
            self.malformed += 1
        self.last_offsets = ([keys[i] for i in good], np.asarray([offsets[i] for i in good], np.int64))
        if table.num_rows == 0:
            return None
        return conform(self.job, table).combine_chunks().to_batches()[0]

    def position(self) -> dict[str, int]:
        return dict(self._next)

    def seek(self, position: Position) -> None:
        tps = []
        for p in self.partitions:
            key = partition_key(self.topic, p)
            offset = int(position[key]) if key in position else self._next.get(key, OFFSET_BEGINNING)
            tps.append(TopicPartition(self.topic, p, offset))
            if offset >= 0:
                self._next[key] = offset
        self.consumer.assign(tps)

    def commit(self, position: Position) -> None:
        self.dead_letters.flush()
        tps = []
        for key, offset in position.items():
            topic, _, part = key.rpartition("/")
            if topic == self.topic and int(part) in self.partitions:
                tps.append(TopicPartition(topic, int(part), int(offset)))
        if tps:
            self.consumer.commit(offsets=tps, asynchronous=False)

    def close(self) -> None:
        try:
            self.dead_letters.close()
        finally:
            self.consumer.close()
