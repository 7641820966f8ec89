"""Kafka stream source (confluent-kafka): one reader per set of topic-partitions, decoded to samples.

Start-up modes: ``group_offsets`` (the group's committed offsets; earliest where none),
``earliest``, ``latest``, ``timestamp`` (the first offset at/after ``startup_timestamp``, via
offsets_for_times; the end of the partition where no message is that new). Every mode is
resolved to concrete offsets when the reader opens (the partition's low/high watermark for
earliest/latest), so ``position()`` names every partition from the start and a checkpoint
taken before the first message still resumes where the reader began. Offsets are never
auto-committed: ``commit(position)`` is called by the owner once a checkpoint covers the rows
(and dead letters are flushed before); requests answered with a transient error (coordinator
moved or loading, leader changing) are asked again. ``lag()`` is Kafka's consumer lag: the high
watermark minus the position, per partition (asked of the broker, one request per leader for all
the reader's partitions); ``at_live_edge()`` says
whether the reader has caught up, from the watermarks of its last fetch responses. Malformed
messages go to ``<topic>.dlq`` with the reason in a header and are counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from primus_lib.credentials import LoginRefused, current
from primus_lib.data.sources.deadletter import DeadLetters, KafkaDeadLetters
from primus_lib.data.sources.decode import conform
from primus_lib.data.sources.kafka_fetch import block_fields, fetch_block
from primus_lib.data.sources.messages import decode_messages
from primus_lib.data.stream import Position, StreamReader
from primus_lib.spec.dataset import SourceSpec, StreamSpec
from primus_lib.spec.job import PrimusJob
from primus_lib.timegrid import epoch_ms

T = TypeVar("T")
PARTITION_CHECK_S = 5.0  # how often a reader asks for the topic's metadata (added partitions, deletion)

# Answers a client recovers from by asking again: the group coordinator or a partition leader
# moved or is still loading (a broker restart, a failover), or a request timed out.
TRANSIENT = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._WAIT_COORD,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    }
)


def _transient(exc: BaseException) -> bool:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in TRANSIENT)


def retrying(call: Callable[[], T], timeout: float = 60.0) -> T:
    """``call()``, asked again while the broker answers with a transient error (up to ``timeout``)."""
    for attempt in Retrying(
        retry=retry_if_exception(_transient), stop=stop_after_delay(timeout), wait=wait_fixed(0.2), reraise=True
    ):
        with attempt:
            return call()
    raise AssertionError("unreachable: tenacity re-raises the last error")


class KafkaLoginRefused(KafkaException, LoginRefused):
    """The broker refused the client's SASL login: asking again cannot help."""

    def __str__(self) -> str:
        return self.args[0].str()


class LoginWatch:
    """A client's ``error_cb``: librdkafka tells a refused SASL login only to that callback (a
    request just times out as a transport failure) and serves it only from ``poll``. The first
    request of a client is asked through ``first_metadata``, so a wrong password is one clear error
    within seconds, not a minute of retries ending in "broker transport failure"."""

    def __init__(self, who: str) -> None:
        self.who = who  # the client, for the message: the source and its connection
        self.refused: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        if error.code() == KafkaError._AUTHENTICATION:
            self.refused = error

    def check(self) -> None:
        """Raise KafkaLoginRefused if the broker has refused the login (after a poll served the callback)."""
        if self.refused is not None:
            reason = f"{self.who}: the broker refused the login ({self.refused.str()})"
            raise KafkaLoginRefused(KafkaError(KafkaError._AUTHENTICATION, reason, fatal=True))

    def first_metadata(self, consumer: Consumer, topic: str | None, timeout: float = 60.0):
        """``consumer.list_topics(topic)`` (every topic: None) of a consumer that has nothing assigned
        yet, asked again while the broker is away (up to ``timeout``); KafkaLoginRefused as soon as
        the login is refused."""

        def ask():
            try:
                return consumer.list_topics(topic, timeout=1.0)
            except KafkaException:
                consumer.poll(0)  # nothing assigned: serves the callbacks, reads no message
                self.check()  # KafkaLoginRefused is not transient: ``retrying`` stops at once
                raise

        return retrying(ask, timeout)


def _checked(answer: list[TopicPartition]) -> list[TopicPartition]:
    """A per-partition answer, raising the first partition's error (retried if transient)."""
    for tp in answer:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return answer


def client_config(stream: StreamSpec, source: SourceSpec) -> dict[str, str]:
    """librdkafka settings of a source: the spec's bootstrap servers, then the settings of its
    ``kafka.connection_id`` (credentials, and its own bootstrap list if it names one; resolved by
    ``primus_lib.credentials``), then ``kafka.options``."""
    assert source.kafka is not None
    config: dict[str, str] = {"bootstrap.servers": source.kafka.bootstrap_servers}
    config.update(connection_config(stream, source))
    config.update(source.kafka.options)
    return config


def connection_config(stream: StreamSpec, source: SourceSpec) -> dict[str, str]:
    """The librdkafka settings of a source's ``kafka.connection_id`` alone (login, security
    protocol, its own bootstrap list if it names one); {} when it names none."""
    assert source.kafka is not None
    where = f"spec.dataset.streams[{stream.name}].sources[{source.name}].kafka.connection_id"
    return current().kafka(source.kafka.connection_id, where)


def login_description(stream: StreamSpec, source: SourceSpec, bootstrap: str) -> str:
    """Who logs in, for a refused login's message: the topic, the broker and the connection."""
    assert source.kafka is not None
    conn = source.kafka.connection_id
    return f"kafka topic {source.kafka.topic!r} at {bootstrap}" + (f" (connection {conn!r})" if conn else "")


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
        self.login = LoginWatch(login_description(stream, source, self.bootstrap))
        config = {
            **client,
            "error_cb": self.login,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "latest" if self.spec.startup == "latest" else "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "fetch.wait.max.ms": 100,
            # librdkafka stops fetching a partition for this long once its local queue is over its
            # thresholds (queued.min.messages): 1 s by default, a second-long stall each time a reader
            # catching up drains the queue faster (bench/stream.py: the floor read 0.18 M rows/s
            # with it, 0.74-1.09 M without)
            "fetch.queue.backoff.ms": 10,
            **self.spec.options,  # the job's explicit settings win over the defaults above
        }
        self.consumer = Consumer(config)
        self.follows_topic = partitions is None  # reads every partition, so also those added later
        self._checked = time.monotonic()
        self.malformed = 0
        self.listed: list[int] = []  # the topic's partitions at the last check (new ones: for the owner to deal)
        self._next: dict[str, int] = {}
        self.last_offsets: tuple[list[str], np.ndarray] = ([], np.empty(0, np.int64))
        try:
            listed = self._all_partitions()  # the reader's first request: a refused login says so here
            self.partitions = sorted(partitions) if partitions is not None else listed
            self.dead_letters = dead_letters or KafkaDeadLetters(self.bootstrap, f"{self.topic}.dlq", client)
            self.consumer.assign(self._start_offsets())
        except BaseException:  # a reader that failed to open must not leave its consumer behind
            self.consumer.close()
            raise

    def _all_partitions(self) -> list[int]:
        meta = self.login.first_metadata(self.consumer, self.topic).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise KafkaException(f"topic {self.topic!r} not found at {self.bootstrap} ({getattr(meta, 'error', None)})")
        return sorted(meta.partitions)

    def _ends(self, end: int, partitions: list[int]) -> dict[int, int]:
        """Every partition's first offset (``end`` = ``OFFSET_BEGINNING``) or the offset its next
        message will get (``OFFSET_END``), in one ListOffsets request per leader broker: these are
        the protocol's earliest and latest sentinel timestamps. ``get_watermark_offsets`` asks two
        requests of a partition, which the executors' reports (every second at a short
        ``scaling.interval``) would pay for every partition they serve."""
        asked = [TopicPartition(self.topic, p, end) for p in partitions]
        answer = retrying(lambda: _checked(self.consumer.offsets_for_times(asked, timeout=10)))
        return {tp.partition: int(tp.offset) for tp in answer}

    def first_offsets(self, partitions: list[int]) -> dict[int, int]:
        """Each partition's first offset (its low watermark), in one request per leader broker."""
        return self._ends(OFFSET_BEGINNING, partitions) if partitions else {}

    def _start_offsets(self) -> list[TopicPartition]:
        """The first offset to read of every partition, resolved now (never a logical offset)."""
        found = self.startup_offsets(self.partitions)
        out = []
        for p in self.partitions:
            self._next[partition_key(self.topic, p)] = found[p]
            out.append(TopicPartition(self.topic, p, found[p]))
        return out

    def startup_offsets(self, partitions: list[int]) -> dict[int, int]:
        """Where the spec's start-up mode starts each of ``partitions``, resolved now."""
        mode = self.spec.startup
        if not partitions:
            return {}
        if mode == "timestamp":
            ms = epoch_ms(self.spec.startup_timestamp)  # type: ignore[arg-type]
            asked = [TopicPartition(self.topic, p, ms) for p in partitions]
            answer = retrying(lambda: _checked(self.consumer.offsets_for_times(asked, timeout=10)))
        elif mode == "group_offsets":
            asked = [TopicPartition(self.topic, p) for p in partitions]
            answer = retrying(lambda: _checked(self.consumer.committed(asked, timeout=10)))
        else:
            answer = []
        found = {tp.partition: int(tp.offset) for tp in answer}
        # earliest/latest, no committed offset, or no message at/after the timestamp
        unresolved = [p for p in partitions if found.get(p, -1) < 0]
        if unresolved:
            found.update(self._ends(OFFSET_END if mode in ("latest", "timestamp") else OFFSET_BEGINNING, unresolved))
        return {p: found[p] for p in partitions}

    def reassign(self, position: Position) -> None:
        """Read exactly the partitions ``position`` names from now on, each from its offset there,
        on this consumer: a partition dropped is no longer fetched (nothing of it is returned
        after this call), one added is fetched from its offset. Closing the reader and opening
        another costs a consumer's start (its connections, metadata and offset requests: 8-12 ms
        of CPU against 1-2 ms to drop two partitions, docs/data.md) at every scale event."""
        wanted = {}
        for key, offset in position.items():
            topic, _, part = key.rpartition("/")
            if topic != self.topic or int(offset) < 0:
                raise ValueError(f"kafka {self.topic}: cannot read {key} from offset {offset}")
            wanted[int(part)] = int(offset)
        self.partitions = sorted(wanted)
        self._next = {partition_key(self.topic, p): wanted[p] for p in self.partitions}
        self.consumer.assign([TopicPartition(self.topic, p, wanted[p]) for p in self.partitions])

    def lag(self) -> dict[str, int]:
        """Messages not yet read, per partition: the high watermark minus the position (two
        requests of the broker for all the reader's partitions)."""
        lows, highs = self._ends(OFFSET_BEGINNING, self.partitions), self._ends(OFFSET_END, self.partitions)
        lags = {}
        for p in self.partitions:
            key = partition_key(self.topic, p)
            low = lows[p]
            lags[key] = max(0, highs[p] - max(self._next.get(key, low), low))
        return lags

    def at_live_edge(self) -> bool:
        """Caught up: every partition's position has reached its high watermark as known from
        the last fetch response (no broker request). False until a fetch has answered for every
        partition, so an empty poll right after opening is not mistaken for the live edge."""
        for p in self.partitions:
            _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
            if high < 0 or self._next.get(partition_key(self.topic, p), -1) < high:
                return False
        return True

    def _follow(self) -> None:
        """Every ``PARTITION_CHECK_S``: a reader of the whole topic takes partitions added since it
        opened (from their first offset: all they hold is new) and says so if the topic is gone."""
        if time.monotonic() - self._checked < PARTITION_CHECK_S:
            return
        self._checked = time.monotonic()
        try:
            meta = self.consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
        except KafkaException:  # the broker is away: the fetches will say so, or recover
            return
        if meta is None or meta.error is not None or not meta.partitions:
            error = getattr(meta, "error", None)
            if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaException(f"topic {self.topic!r} no longer exists at {self.bootstrap} (deleted?)")
            return
        self.listed = sorted(meta.partitions)
        if not self.follows_topic:
            return
        added = sorted(set(meta.partitions) - set(self.partitions))
        if added:
            for p, low in self.first_offsets(added).items():
                self._next[partition_key(self.topic, p)] = low
            self.partitions = sorted(self.partitions + added)
            self.consumer.assign(
                [TopicPartition(self.topic, p, self._next[partition_key(self.topic, p)]) for p in self.partitions]
            )

    def poll(self, max_rows: int, timeout: float) -> pa.RecordBatch | None:
        self._follow()
        messages = fetch_block(self.consumer, max_rows, timeout)
        partitions = {p: partition_key(self.topic, p) for p in self.partitions}  # the partitions read now
        messages, keys, offsets = block_fields(messages, self.topic, partitions)
        values = [msg.value() or b"" for msg in messages]
        if not values:
            self.last_offsets = ([], np.empty(0, np.int64))
            return None
        fetched = np.asarray(offsets, np.int64)
        self._next.update(zip(keys, (fetched + 1).tolist(), strict=True))  # a partition's last message wins
        table, good, bad = decode_messages(self.job, self.stream, self.source, values, f"kafka {self.topic}")
        for item in bad:
            origin = f"{keys[item.index]}@{offsets[item.index]}"
            self.dead_letters.send(values[item.index], item.reason, origin)
            self.malformed += 1
        if bad:
            self.last_offsets = ([keys[i] for i in good], fetched[np.asarray(good, np.intp)])
        else:
            self.last_offsets = (keys, fetched)
        if table.num_rows == 0:
            return None
        return conform(self.job, table).combine_chunks().to_batches()[0]

    def position(self) -> dict[str, int]:
        return dict(self._next)

    def seek(self, position: Position) -> None:
        """Read each partition from ``position`` on (the others where they are). A seek to where
        the reader is already keeps the consumer's assignment: assigning again drops what
        librdkafka fetched ahead (a trainer's attach: the executor's first rows came 0.2 s later)."""
        tps, moved = [], False
        for p in self.partitions:
            key = partition_key(self.topic, p)
            offset = int(position[key]) if key in position else self._next.get(key, OFFSET_BEGINNING)
            tps.append(TopicPartition(self.topic, p, offset))
            moved = moved or offset != self._next.get(key)
            if offset >= 0:
                self._next[key] = offset
        if moved or {tp.partition for tp in self.consumer.assignment()} != set(self.partitions):
            self.consumer.assign(tps)

    def commit(self, position: Position) -> None:
        self.dead_letters.flush()
        tps = []
        for key, offset in position.items():
            topic, _, part = key.rpartition("/")
            if topic == self.topic and int(part) in self.partitions:
                tps.append(TopicPartition(topic, int(part), int(offset)))
        if tps:  # the same offsets again: safe to repeat while the coordinator moves
            retrying(lambda: self.consumer.commit(offsets=tps, asynchronous=False))

    def close(self) -> None:
        try:
            self.dead_letters.close()
        finally:
            self.consumer.close()
