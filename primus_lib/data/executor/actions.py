"""The Flight actions of a stream executor (``service.py``): how a trainer's reader steers it.

- ``commit {"position": {key: offset}}``: commit those offsets of this executor's partitions to
  the consumer group. Called by the trainer once its checkpoint covers the rows; the executor
  never commits on its own.
- ``seek {"position": {...}}``: drop the buffer and read again from ``position``; partitions it
  does not name restart from the group's committed offsets (else the startup offsets). A trainer
  calls it when it attaches, so rows handed to a trainer that died before its checkpoint are
  served again. Kafka is not read before the first seek: whatever was read earlier would be
  dropped by it.
- ``assign {"partitions": [...], "position": {...}}``: serve exactly these partitions from now on.
  The trainer's reader decides from the live membership (``flight_client.py``): executor ``k`` of
  the ``n`` it sees gets every ``n``-th partition, so a scale from 2 to 3 executors or a dead
  executor moves partitions. A partition it loses stops being read and its waiting rows are
  dropped; one it gains is read from ``position`` (the reader's marks: just past what it was
  given), else the group's committed offsets. Serving a partition from two executors for a
  moment is harmless: the reader accepts each offset once, and each serves it contiguously
  from a start at or below the mark.
- ``ack {"position": {...}}``: the reader holds every row below these offsets. A ``DoGet`` hands rows
  out under a lease (``leases.py``): unacknowledged within ``lease`` seconds, they are served again.
- ``stats`` (buffer fill, partitions, fetched position, committed), ``lag`` (consumer lag),
  ``partitions`` (every partition of the stream it knows, in dealing order).

A mixin of ``service.ExecutorService`` (it works on the service's runners, buffer and lanes), kept
apart so that the service's own module holds how partitions are read and this one what a reader
may ask of them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Protocol

from primus_lib.data.executor.partitions import stream_partitions

if TYPE_CHECKING:
    from primus_lib.data.executor.lanes import Lanes
    from primus_lib.data.executor.leases import LeasedBuffer
    from primus_lib.data.executor.service import _Runner
    from primus_lib.data.flight import BufferFlightServer
    from primus_lib.data.sources.kafka import KafkaStreamReader
    from primus_lib.spec.job import PrimusJob

log = logging.getLogger("primus_lib.data.executor.service")


class ActionHost(Protocol):
    """What the actions use of the ``ExecutorService`` they are mixed into (``service.py`` checks it is one)."""

    runners: list[_Runner]
    generation: int
    opened: int

    @property
    def job(self) -> PrimusJob: ...
    @property
    def stream_name(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def replicas(self) -> int: ...
    @property
    def mode(self) -> str: ...
    @property
    def buffer(self) -> LeasedBuffer: ...
    @property
    def lanes(self) -> Lanes | None: ...
    @property
    def server(self) -> BufferFlightServer: ...
    @property
    def committed(self) -> dict[str, int]: ...
    @property
    def all_partitions(self) -> list[tuple[int, int]]: ...
    @property
    def _admin(self) -> threading.RLock: ...
    @property
    def _attached(self) -> threading.Event: ...
    @property
    def keys(self) -> list[str]: ...
    @property
    def all_keys(self) -> list[str]: ...
    @property
    def filled(self) -> int: ...
    @property
    def rows_in(self) -> int: ...
    def _key(self, pair: tuple[int, int]) -> str: ...
    def _open(
        self,
        pairs: list[tuple[int, int]],
        position: dict[str, int],
        new: Iterable[str] = frozenset(),
    ) -> list[_Runner]: ...
    def _repartition(self, runner: _Runner, mine: list[int], position: dict[str, int], new: Iterable[str]) -> None: ...
    def _spawn(self, runner: _Runner) -> None: ...
    def _committed(self, reader: KafkaStreamReader, partitions: list[int] | None = None) -> dict[str, int]: ...
    def _learn(self, pairs: list[tuple[int, int]]) -> list[str]: ...
    def _ack(self, body: dict) -> dict: ...
    def _position(self) -> dict[str, int]: ...


class ExecutorActions:
    """``seek``, ``assign``, ``ack``, ``commit``, ``stats`` and ``lag`` of ``ExecutorService``."""

    def _seek(self: ActionHost, body: dict) -> dict:
        """Rewind to ``position`` (rebalance: lane ``lane`` of ``lanes`` wants it; the others keep
        what they still need)."""
        position, lane, lanes = _position_of(body), int(body.get("lane", 0)), int(body.get("lanes", 1))
        with self._admin:
            with ExitStack() as held:
                for runner in self.runners:  # each loop lets the seek have its lock before its next poll
                    held.enter_context(runner.steered())
                self.generation += 1
                dropped = self.buffer.clear()
                if self.lanes is not None:
                    if lanes != self.lanes.count:
                        self.lanes.reset(lanes)
                    dropped += self.lanes.clear()
                for runner in self.runners:
                    base = self._committed(runner.reader)
                    target = {k: position.get(k, base.get(k, off)) for k, off in runner.start.items()}
                    if self.lanes is not None:
                        target = self.lanes.rewind_to(
                            lane, position, {k: base.get(k, off) for k, off in runner.start.items()}
                        )
                    runner.reader.seek(target)
                    runner.delivered.clear()
            self._attached.set()
            return {
                "position": self._position(),
                "dropped": dropped,
                "partitions": self.keys,
                "all": self.all_keys,
                "mode": self.mode,
            }

    def _assign(self: ActionHost, body: dict) -> dict:
        """Serve exactly ``partitions``: a source's reader that keeps some of its partitions is
        repartitioned in place (kept ones continue where they were, the waiting rows of lost ones
        are dropped), one that keeps none is closed, a source not read yet gets a reader; new
        partitions start at ``position`` (the reader's marks) or the committed offsets."""
        wanted = {str(k) for k in body.get("partitions") or []}
        if wanted - set(self.all_keys):  # added to a topic since this executor last looked
            self._learn(stream_partitions(self.job, self.stream_name))
        unknown = sorted(wanted - set(self.all_keys))
        if unknown:
            raise ValueError(f"assign: {unknown} are not partitions of stream {self.stream_name!r}")
        with self._admin:
            if wanted == set(self.keys):
                return {"partitions": self.keys, "dropped": 0}
            position, new = _position_of(body), {str(k) for k in body.get("new") or []}
            # a consumer a source, kept across assigns: reopening one cost a consumer's start
            # (connections, metadata, offset requests) and its kept partitions' place (docs/data.md)
            mine: dict[int, list[int]] = {}
            for source, partition in self.all_partitions:
                if self._key((source, partition)) in wanted:
                    mine.setdefault(source, []).append(partition)
            gone = set(self.keys) - wanted
            for runner in list(self.runners):
                partitions = mine.pop(runner.source, [])
                if not partitions:
                    runner.stopped.set()
                    if runner.thread is not None:
                        runner.thread.join(5)
                    with runner.lock:
                        runner.reader.close()
                    self.runners.remove(runner)
                elif {self._key((runner.source, p)) for p in partitions} != set(runner.start):
                    self._repartition(runner, partitions, position, new)
            dropped = (self.buffer.drop(gone) + (self.lanes.drop(gone) if self.lanes else 0)) if gone else 0
            runners = self._open([(s, p) for s, ps in mine.items() for p in ps], position, new=new)
            self.runners += runners
            for runner in runners:
                self._spawn(runner)
            log.info(
                "stream executor %s/%d: serves %s (dropped %d rows of %s)",
                self.stream_name,
                self.index,
                self.keys,
                dropped,
                sorted(gone),
            )
            return {"partitions": self.keys, "dropped": dropped}

    def _ack(self: ActionHost, body: dict) -> dict:
        """The reader holds every row below ``position`` (rebalance: of lane ``lane``): their leases end."""
        position = _position_of(body)
        if self.lanes is not None:
            return {"released": self.lanes.ack(int(body.get("lane", 0)), position)}
        return {"released": self.buffer.ack(position)}

    def _commit(self: ActionHost, body: dict) -> dict:
        """Commit ``position`` (rebalance: rank ``lane``'s; Kafka gets the lowest over the ranks); acks it."""
        self._ack(body)
        position = _position_of(body)
        if self.lanes is not None:
            position = self.lanes.committable(int(body.get("lane", 0)), position)
        done: dict[str, int] = {}
        with self._admin:
            for runner in self.runners:
                theirs = {k: v for k, v in position.items() if k in runner.start}
                if theirs:
                    with runner.steered():
                        runner.reader.commit(theirs)
                    done.update(theirs)
        self.committed.update(done)
        return {"committed": done}

    def _position(self: ActionHost) -> dict[str, int]:
        return {k: v for r in self.runners for k, v in r.reader.position().items()}

    def _stats(self: ActionHost, body: dict) -> dict:
        return {
            "index": self.index,
            "replicas": self.replicas,
            "mode": self.mode,
            "partitions": self.keys,
            "readers": len(self.runners),  # Kafka consumers: one a source
            "opened": self.opened,  # consumers opened since start (an assign keeps a source's)
            "position": self._position(),
            "committed": dict(self.committed),
            "rows": self.filled,
            "rows_in": self.rows_in,
            "capacity": self.buffer.capacity,
            "errors": sum(r.errors for r in self.runners),
            "leased": self.buffer.leased() + (self.lanes.leased() if self.lanes is not None else 0),
            "refused": self.server.auth.refused if self.server.auth is not None else 0,
        }

    def _lag(self: ActionHost, body: dict) -> dict:
        out: dict[str, int] = {}
        with self._admin:
            for runner in self.runners:
                with runner.steered():
                    out.update(runner.reader.lag())
        return {"lag": out}


def _position_of(body: dict) -> dict[str, int]:
    return {str(k): int(v) for k, v in (body.get("position") or {}).items()}
