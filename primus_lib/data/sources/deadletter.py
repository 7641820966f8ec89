"""Dead letters: malformed stream messages are counted and kept, never silently dropped.

Two sinks: a Kafka topic (``<topic>.dlq``, the original value with the reason and origin in
headers) and a JSONL file under the job directory. ``flush()`` makes them durable; stream
readers flush before committing offsets that skip the bad messages.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from abc import ABC, abstractmethod
from pathlib import Path

KEEP_BYTES = 64 << 10  # of a dead letter's value: enough to see what it was


class DeadLetters(ABC):
    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def send(self, value: bytes, reason: str, origin: str) -> None:
        if len(value) > KEEP_BYTES:  # a DLQ topic refuses what its source topic took (its own size limit)
            reason = f"{reason} (value cut to its first {KEEP_BYTES} of {len(value)} bytes)"
            value = value[:KEEP_BYTES]
        with self._lock:
            self.count += 1
            self._send(value, reason, origin)

    @abstractmethod
    def _send(self, value: bytes, reason: str, origin: str) -> None: ...

    def flush(self) -> None:  # noqa: B027
        pass

    def close(self) -> None:
        self.flush()


class FileDeadLetters(DeadLetters):
    """Appends one JSON line per dead letter: reason, origin, and the raw value (text or base64)."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "a", encoding="utf-8")

    def _send(self, value: bytes, reason: str, origin: str) -> None:
        try:
            body = {"value": value.decode("utf-8")}
        except UnicodeDecodeError:
            body = {"value_b64": base64.b64encode(value).decode()}
        self._handle.write(json.dumps({"reason": reason, "origin": origin, **body}) + "\n")

    def flush(self) -> None:
        with self._lock:
            self._handle.flush()
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        self.flush()
        self._handle.close()


class KafkaDeadLetters(DeadLetters):
    """Produces each dead letter to a DLQ topic (created if missing)."""

    def __init__(self, bootstrap: str, topic: str, options: dict | None = None):
        super().__init__()
        from confluent_kafka import Producer

        self.topic = topic
        _ensure_topic(bootstrap, topic, options)
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **(options or {})})
        self._errors: list[str] = []

    def _send(self, value: bytes, reason: str, origin: str) -> None:
        headers: list[tuple[str, str | bytes | None]] = [
            ("primus.error", reason.encode()[:1000]),
            ("primus.origin", origin.encode()),
        ]
        self._producer.produce(self.topic, value, headers=headers, on_delivery=self._delivered)
        self._producer.poll(0)

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self._errors.append(str(err))

    def flush(self, timeout: float = 30.0) -> None:
        left = self._producer.flush(timeout)
        if left or self._errors:
            raise RuntimeError(f"dead-letter topic {self.topic}: {left} undelivered, errors {self._errors[:3]}")


def _ensure_topic(bootstrap: str, topic: str, options: dict | None = None) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({**(options or {}), "bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=10).topics:
        return
    # one partition (dead letters stay in order); the cluster's default.replication.factor (-1)
    for future in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1)]).values():
        try:
            future.result(15)
        except KafkaException as exc:  # another reader of the same topic created it first
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
