"""A stream data executor as a service: its share of a stream's Kafka partitions, served over Flight.

Executor ``index`` of ``replicas`` owns every ``replicas``-th partition of the stream's Kafka
sources (``topic/partition`` keys in sorted order). One runner thread per source polls and
decodes into a bounded ``SampleBuffer``; while the buffer is full the runner stops polling, so
the consumer lag grows instead of memory (back-pressure). The Flight server (``flight.py``,
tagged) hands out rows with their partition and offset, and answers the actions a trainer's
reader steers it with (``actions.py``: seek, assign, ack, commit, stats, lag, partitions).

Every call needs the job's token (``primus_lib.data.flight_auth``; ``credential``, else the one
``discovery`` names): a caller without it, or with another job's, is refused before the method runs.

Partitions added to a topic while it runs: each runner's reader lists the topic every
``PARTITION_CHECK_S`` (the check a whole-topic reader adds them with, ``sources/kafka.py``); a new
one joins ``partitions`` (an ``assign`` naming one not seen yet lists the topics again first). The
trainer's reader deals it like any other; it is read from its first offset unless it has a
committed offset or a mark (everything in it is new, whatever the start-up mode).

``shuffle: rebalance``: one lane per trainer rank instead of one buffer (``lanes.py``): every
rank pulls its lane (ticket ``rows=N;lane=R``) from every executor; ``seek`` and ``commit`` name
the rank's ``lane`` and the world size ``lanes``.

On start the executor serves every ``replicas``-th partition (its index's share) until told
otherwise, from the group's committed offsets where there are some (the spec's startup mode
elsewhere).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import TopicPartition

from primus_lib.data.buffer import BufferClosed, past
from primus_lib.data.executor.actions import ActionHost, ExecutorActions
from primus_lib.data.executor.lanes import Lanes
from primus_lib.data.executor.leases import LEASE_SECONDS, LeasedBuffer
from primus_lib.data.executor.partitions import in_order, owned, stream_partitions
from primus_lib.data.flight import Action, BufferFlightServer
from primus_lib.data.flight_auth import Credential, credential_for
from primus_lib.data.schema import job_keys, load_string_hashing, sample_schema
from primus_lib.data.sources.kafka import KafkaStreamReader, partition_key, retrying
from primus_lib.resources.discovery import ExecutorDiscovery
from primus_lib.spec.job import PrimusJob

log = logging.getLogger(__name__)
REPORTER_JOIN_SECONDS = 5.0


@dataclass
class _Runner:
    reader: KafkaStreamReader
    start: dict[str, int]  # the startup offsets (spec's mode), where the group has committed none
    source: int = 0  # the stream's source (index) it reads
    delivered: dict[str, int] = field(default_factory=dict)  # just past the rows put in the buffer since a seek
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    rows: int = 0
    errors: int = 0
    epoch: int = 0  # bumped when its partitions change: a batch polled before is not put
    steering: threading.Event = field(default_factory=threading.Event)  # an action waits for the lock

    @contextmanager
    def steered(self) -> Iterator[None]:
        """The runner's lock for an action: its loop, which takes the lock again as soon as a poll
        returns, lets the action have it first (a plain lock would let the loop win for several polls)."""
        self.steering.set()
        try:
            with self.lock:
                yield
        finally:
            self.steering.clear()


class ExecutorService(ExecutorActions):
    def __init__(
        self,
        job: PrimusJob,
        stream: str,
        index: int,
        replicas: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        capacity_rows: int = 65536,
        poll_rows: int = 4096,
        wait: float = 0.2,
        discovery: ExecutorDiscovery | None = None,
        credential: Credential | None = None,
        lease: float = LEASE_SECONDS,
    ):
        self.job, self.stream_name, self.index, self.replicas = job, stream, index, replicas
        spec = job.stream(stream)
        if spec.kind != "stream":
            raise ValueError(f"stream {stream!r} is a batch stream: batch data executors are Airflow tasks")
        self.mode = spec.shuffle
        self.poll_rows, self.discovery, self.spec = poll_rows, discovery, spec
        self.all_partitions = stream_partitions(job, stream)  # grows when the topic does (``_learn``)
        self._added: set[str] = set()  # partitions added since start: read from their first offset
        self._grow = threading.Lock()
        self.partitions = owned(self.all_partitions, index, replicas)
        self.credential = credential or (credential_for(discovery) if discovery is not None else None)
        if self.credential is None:
            raise ValueError(f"stream executor {stream}/{index}: no credential (the job's Flight token)")
        self.credential.token()  # made now if this job has none yet; a pod without its Secret stops here
        load_string_hashing()
        self.buffer = LeasedBuffer(capacity_rows, lease)
        self.lanes = Lanes(capacity_rows, seed=index, hold=lease) if self.mode == "rebalance" else None  # per rank
        self.runners: list[_Runner] = []
        self.opened = 0  # Kafka consumers opened since start (stats)
        self._admin = threading.RLock()  # actions that change or walk the runners
        try:
            self.runners += self._open(self.partitions, {})
        except BaseException:
            self.close_readers()
            raise
        self.committed: dict[str, int] = {}
        self.generation = 0
        self._stop = threading.Event()
        self._attached = threading.Event()  # Kafka is read once a trainer attached (its first seek)
        self._reporter: threading.Thread | None = None  # report(): writes the metrics snapshot
        schema = sample_schema(job.spec.features, job_keys(job))
        actions: dict[str, Action] = {
            "stats": self._stats,
            "commit": self._commit,
            "seek": self._seek,
            "lag": self._lag,
            "assign": self._assign,
            "partitions": lambda body: {"all": self.all_keys},
            "ack": self._ack,
        }
        self.server = BufferFlightServer(
            self.buffer,
            schema,
            f"grpc://{host}:{port}",
            wait=wait,
            tagged=True,
            actions=actions,
            lanes=None if self.lanes is None else self.lanes.pop,
            pop=self.buffer.lease,
            credential=self.credential,
        )
        self.location = f"grpc://{advertise or host}:{self.server.port}"

    @property
    def keys(self) -> list[str]:
        """The partitions this executor serves now."""
        return sorted(key for r in self.runners for key in r.start)

    @property
    def all_keys(self) -> list[str]:
        """Every partition of the stream, in the order shares are dealt."""
        return [self._key(pair) for pair in self.all_partitions]

    def _key(self, pair: tuple[int, int]) -> str:
        return partition_key(self.spec.sources[pair[0]].kafka.topic, pair[1])  # type: ignore[union-attr]

    def _open(
        self,
        pairs: list[tuple[int, int]],
        position: dict[str, int],
        new: Iterable[str] = frozenset(),
    ) -> list[_Runner]:
        """One reader per source over ``pairs``, each partition at ``position`` / the committed
        offsets / startup (rebalance: no later than any lane needs); startup of a partition added
        while running (``new``, ``_added``) is its first offset."""
        runners, new = [], set(new) | self._added
        for i, source in enumerate(self.spec.sources):
            mine = [p for s, p in pairs if s == i]
            if mine:
                reader = KafkaStreamReader(self.job, self.spec, source, partitions=mine)
                self.opened += 1
                start = {  # its start-up offsets were resolved as it opened: only added partitions to ask
                    **reader.position(),
                    **self._starts(reader, [p for p in mine if self._key((i, p)) in new], new),
                }
                runners.append(_Runner(reader, start, i))
                reader.seek(self._targets(reader, start, position, {}))
        return runners

    def _repartition(self, runner: _Runner, mine: list[int], position: dict[str, int], new: Iterable[str]) -> None:
        """``runner`` reads exactly ``mine`` of its source from now on, on its own consumer: kept
        partitions resume where it left them (``delivered``), gained ones as ``_open`` starts them."""
        reader, new = runner.reader, set(new) | self._added
        with runner.steered():
            runner.epoch += 1
            keys = {partition_key(reader.topic, p) for p in mine}
            kept = {k: v for k, v in runner.delivered.items() if k in keys}
            gained = [p for p in mine if partition_key(reader.topic, p) not in runner.start]
            start = {**{k: v for k, v in runner.start.items() if k in keys}, **self._starts(reader, gained, new)}
            reader.reassign(self._targets(reader, start, position, kept))
            runner.start, runner.delivered = start, kept

    @staticmethod
    def _starts(reader: KafkaStreamReader, partitions: list[int], new: set[str]) -> dict[str, int]:
        """Where each of ``partitions`` starts where the group committed nothing: one added to the
        topic while running (``new``) at its first offset, the others by the spec's start-up mode."""
        added = [p for p in partitions if partition_key(reader.topic, p) in new]
        found = {**reader.startup_offsets([p for p in partitions if p not in added]), **reader.first_offsets(added)}
        return {partition_key(reader.topic, p): found[p] for p in partitions}

    def _targets(
        self, reader: KafkaStreamReader, start: dict[str, int], position: dict[str, int], kept: dict[str, int]
    ) -> dict[str, int]:
        """Where to read each partition of ``start``: ``kept``, else ``position``, else the group's
        committed offset, else ``start`` (rebalance: no later than any lane still needs)."""
        base = {**start, **self._committed(reader, [int(k.rpartition("/")[2]) for k in start])}
        target = {k: position.get(k, v) for k, v in base.items()}
        if self.lanes is not None:
            target = {k: min(v, self.lanes.start_of(k, base[k])) for k, v in target.items()}
        return {**target, **{k: v for k, v in kept.items() if k in base}}

    def _spawn(self, runner: _Runner) -> None:
        runner.thread = threading.Thread(target=self._run, args=(runner,), name="executor-runner", daemon=True)
        runner.thread.start()

    @staticmethod
    def _committed(reader: KafkaStreamReader, partitions: list[int] | None = None) -> dict[str, int]:
        """The group's committed offsets of ``partitions`` (default: the reader's), those it has."""
        asked = [TopicPartition(reader.topic, p) for p in (reader.partitions if partitions is None else partitions)]
        answer = retrying(lambda: reader.consumer.committed(asked, timeout=10))
        return {partition_key(tp.topic, tp.partition): tp.offset for tp in answer if tp.offset >= 0}

    def start(self) -> ExecutorService:
        for runner in self.runners:
            self._spawn(runner)
        if self.discovery is not None:
            info = {"stream": self.stream_name, "replicas": self.replicas, "partitions": self.keys}
            self.discovery.register(self.index, self.location, info)
        return self

    def _run(self, runner: _Runner) -> None:
        while not self._attached.wait(0.2):
            if self._stop.is_set():
                return
        while not self._stop.is_set() and not runner.stopped.is_set():
            if runner.steering.is_set():  # an action is waiting for the lock
                time.sleep(0.001)
                continue
            try:
                with runner.lock:
                    generation, epoch = self.generation, runner.epoch
                    batch = runner.reader.poll(self.poll_rows, 0.2)
                    offsets = runner.reader.last_offsets
                if len(runner.reader.listed) > sum(s == runner.source for s, _ in self.all_partitions):
                    self._learn([(runner.source, p) for p in runner.reader.listed])
                if batch is None:
                    continue
                pieces = [(-1, (batch, *offsets))] if self.lanes is None else self.lanes.split(batch, *offsets)
                while pieces and not self._stop.is_set() and not runner.stopped.is_set():  # full: no polling
                    if runner.steering.is_set():  # a full buffer's puts would keep an action waiting
                        time.sleep(0.001)
                        continue
                    with runner.lock:
                        if generation != self.generation or epoch != runner.epoch:
                            break  # a seek rewound the reader, or its partitions changed: this batch is stale
                        if self._put(*pieces[0]):
                            pieces.pop(0)
                            if not pieces:  # all of it in: kept partitions may resume past it
                                runner.rows += batch.num_rows
                                runner.delivered.update(past(*offsets))
            except BufferClosed:
                return
            except Exception:
                runner.errors += 1
                log.exception("stream executor %s/%d: runner failed; retrying", self.stream_name, self.index)
                time.sleep(1.0)

    def _learn(self, pairs: list[tuple[int, int]]) -> list[str]:
        """Partitions of the stream seen in the topics' metadata but not known yet (added to a
        topic while running): known from now on, for the trainer's reader to deal."""
        with self._grow:
            new = sorted(set(pairs) - set(self.all_partitions))
            if new:
                self.all_partitions = in_order(self.all_partitions + new)
                self._added |= {self._key(pair) for pair in new}
                log.info(
                    "stream executor %s/%d: partitions %s added to the topic",
                    self.stream_name,
                    self.index,
                    [self._key(pair) for pair in new],
                )
        return [self._key(pair) for pair in new]

    def _put(self, lane: int, piece: tuple) -> bool:
        """Into the buffer (forward, lane -1) or a rank's lane (rebalance); False while full."""
        if lane < 0:
            return self.buffer.put(piece[0], piece[1:], timeout=0.05)
        if self.lanes is None:
            raise RuntimeError(f"lane {lane}: this executor has no lanes (its shuffle is not rebalance)")
        return self.lanes.put(lane, piece, 0.05)

    @property
    def filled(self) -> int:
        return len(self.buffer) + (len(self.lanes) if self.lanes is not None else 0)

    @property
    def rows_in(self) -> int:
        return self.buffer.rows_in + (self.lanes.rows_in if self.lanes is not None else 0)

    def report(self, every: float | None = None) -> threading.Thread:
        """Write this executor's metrics for the scaler (``service_metrics.py``; ``every``: its default
        follows the scaler's interval)."""
        from primus_lib.data.executor.service_metrics import report

        self._reporter = report(self, every)
        return self._reporter

    def stop(self) -> None:
        self._stop.set()
        if self._reporter is not None:
            self._reporter.join(REPORTER_JOIN_SECONDS)  # its last act: removing the metrics snapshot
        self.buffer.close()
        if self.lanes is not None:
            self.lanes.close()
        if self.discovery is not None:
            self.discovery.unregister(self.index)
        self.server.shutdown()
        for runner in self.runners:
            if runner.thread is not None:
                runner.thread.join(5)
        self.close_readers()

    def close_readers(self) -> None:
        for runner in self.runners:
            try:
                runner.reader.close()
            except Exception:
                log.exception("closing a Kafka reader")


if TYPE_CHECKING:  # the service is what its actions take it for (mypy does not check that inside the class)
    _checked: type[ActionHost] = ExecutorService
