"""The trainer's side of the stream executors: one ``StreamReader`` pulling from all of them.

One puller thread per executor (found through an ``ExecutorDiscovery``) pops tagged batches over
Flight into a local bounded ``SampleBuffer``; while it is full the pullers stop asking, the
executors' buffers fill and they stop polling Kafka (back-pressure end to end).

Exactly once: every row arrives with its partition and offset. The reader keeps, per
partition, the offset just past the last row it accepted and drops anything below it (a
restarted executor resumes from the committed offsets, which may lie behind). ``position()`` is
what the trainer has taken (the popped rows, exactly like a Kafka reader's), so the trainer's
checkpoint records each partition's handed-out position. On (re)connecting to an executor the
puller sends ``seek`` with what it has accepted, so the executor serves from there, and rows a
dead trainer took but never checkpointed are served again to its successor (which seeks to
its checkpoint). ``commit(position)`` asks every executor to commit its partitions' offsets:
called by the trainer after its checkpoint, never before.

Partition ownership follows the live membership: the reader deals its partitions over the
executors it has attached, in index order (the k-th of n serves every n-th partition), and tells
each its share with ``assign`` and this reader's marks, which is where a gained partition starts.
An executor joining (a scale up, a restart) takes its share at once; one gone (a scale down, a
crash) keeps its share for ``takeover_after`` seconds, then the others take it over. The losers
are told first; serving a partition from two executors for a moment is harmless anyway: each
serves it contiguously from a start at or below the mark, and each offset is accepted once.

Partitions added to a topic while running: the reader asks its executors for the stream's
partitions (``partitions``) every ``universe_every`` seconds (they see the topic's metadata every
``PARTITION_CHECK_S``) and appends the new ones to its dealing order, so no partition it already
dealt moves; the executor that gets one reads it from its first offset (``new`` in ``assign``).

One trainer process pulls from each executor (a second one would rewind it with its seeks);
under data parallelism rank r of n pulls the executors whose index is r modulo n and owns every
n-th partition (the executors list them all, in the same order); rows of another rank's
partitions are dropped, so a partition never reaches two ranks. With ``shuffle="rebalance"``
(the stream's spec) every rank pulls its own lane from every executor instead (``executor/lanes.py``:
rows spread round-robin over the ranks by offset, so no rank starves on light partitions); rank 0
deals the partitions, and each rank's position holds its own lane's marks.

Every call carries the job's Flight token (``flight_auth.py``: where the discovery says; a refused
call reads it again before the next try). Each pulled batch is acknowledged (``ack``) as soon as
it arrives: rows handed out but never acknowledged are the executor's to serve again.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from primus_lib.data.buffer import BufferClosed, SampleBuffer, past
from primus_lib.data.flight import FlightBufferClient
from primus_lib.data.flight_auth import Credential, credential_for
from primus_lib.data.stream import Position, StreamReader
from primus_lib.resources.discovery import ExecutorDiscovery

log = logging.getLogger(__name__)
ERRORS = (flight.FlightError, OSError, pa.ArrowException)
NO_EXECUTOR_WARNING = 30.0  # seconds without any executor before the reader says so (once, until one comes)


class ExecutorStreamReader(StreamReader):
    def __init__(
        self,
        discovery: ExecutorDiscovery,
        *,
        buffer_rows: int = 65536,
        pull_rows: int = 8192,
        retry: float = 0.5,
        call_timeout: float = 30.0,
        rank: int = 0,
        size: int = 1,
        takeover_after: float = 3.0,
        shuffle: str = "forward",
        universe_every: float = 1.0,
        credential: Credential | None = None,
    ):
        if shuffle not in ("forward", "rebalance"):
            raise ValueError(f"shuffle must be 'forward' or 'rebalance', got {shuffle!r}")
        self.shuffle, self.lane = shuffle, (rank if shuffle == "rebalance" else None)
        self.takeover_after = takeover_after  # seconds an executor may be gone before the others take its share
        self.rank, self.size = rank, size  # under data parallelism rank r pulls executors i with i % size == r
        self.discovery, self.pull_rows, self.retry, self.call_timeout = discovery, pull_rows, retry, call_timeout
        self.credential = credential if credential is not None else credential_for(discovery)
        self.buffer_rows = buffer_rows
        self.buffer = SampleBuffer(buffer_rows)
        self._start: dict[str, int] = {}
        self._fetched: dict[str, int] = {}  # per partition: just past the last row accepted from executors
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pullers: dict[int, threading.Thread] = {}
        self._empty: dict[int, bool] = {}
        self._owned: dict[int, list[str]] = {}  # attached executor -> the partitions it serves (its answers)
        self._universe: list[str] | None = None  # this rank's partitions, in dealing order (told on attach)
        self._all: list[str] | None = None  # the stream's partitions, in dealing order: only ever appended to
        self._added: set[str] = set()  # partitions added to a topic since this reader first listed them
        self.universe_every, self._listed = universe_every, 0.0
        self._seen: dict[int, float] = {}
        self._watcher: threading.Thread | None = None
        self._deal_lock = threading.Lock()  # one dealing at a time (the watcher, a puller attaching)
        self.last_offsets: tuple[list[str], np.ndarray] = ([], np.empty(0, np.int64))
        self.duplicates = 0  # rows dropped: at or below what was already accepted
        self.reconnects = 0
        self.commit_failures = 0
        self.takeovers = 0  # executors gone for good: their share dealt to the others
        self.assignments = 0  # ``assign`` calls that changed an executor's share

    def locations(self) -> dict[int, str]:
        """This reader's executors (all of them in a world of one, or in rebalance mode)."""
        found = self.discovery.locations()
        return found if self.lane is not None else {i: loc for i, loc in found.items() if i % self.size == self.rank}

    def _client(self, location: str) -> FlightBufferClient:
        token = None if self.credential is None else self.credential.token()
        return FlightBufferClient(location, timeout=self.call_timeout, token=token)

    def _failed(self, exc: Exception) -> None:
        """After a refused call the token is read again (the executors may have settled on another)."""
        if isinstance(exc, flight.FlightUnauthenticatedError) and self.credential is not None:
            self.credential.token(fresh=True)

    # -- pulling ---------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._watch, name="executor-watch", daemon=True)
            self._watcher.start()
            deadline = time.monotonic() + 1.0  # let the first pullers attach before the first poll
            while not self._pullers and time.monotonic() < deadline:
                time.sleep(0.02)

    def _watch(self) -> None:
        stop = self._stop
        alone_since, told = time.monotonic(), False  # since when no executor was found; said so once
        while not stop.is_set():
            try:
                locations = self.locations()
            except Exception:
                log.exception("executor discovery failed")
                locations = {}
            if locations:
                alone_since, told = time.monotonic(), False
            elif not told and time.monotonic() - alone_since >= NO_EXECUTOR_WARNING:
                told = True  # the stream reads nothing until one registers: a person should know why
                log.warning(
                    "no stream executor found in %s for %g s: waiting (start them with `primus executor "
                    "SPEC` or through the job's resource backend)",
                    self.discovery.describe(),
                    NO_EXECUTOR_WARNING,
                )
            self._follow_partitions(locations)
            # pullers first: a new executor reads its start-up share from its attach (seek) on, while
            # the dealing waits for the losers' assigns (dealt first, the added executors sat idle
            # 2-4 s under a 0.15-core cap: bench/scaling.py's trace, docs/scaling.md)
            for index, location in locations.items():
                thread = self._pullers.get(index)
                if thread is None or not thread.is_alive():
                    thread = threading.Thread(
                        target=self._pull, args=(index, location, stop), name=f"executor-pull-{index}", daemon=True
                    )
                    self._pullers[index] = thread
                    thread.start()
            self._deal(locations)
            stop.wait(self.retry)

    def _pull(self, index: int, location: str, stop: threading.Event) -> None:
        buffer = self.buffer
        client = None
        try:
            client = self._client(location)
            with self._lock:
                position = dict(self._fetched)
            told = client.action("seek", {"position": position, "lane": self.rank, "lanes": self.size})
            if told.get("mode", self.shuffle) != self.shuffle:
                log.error(
                    "executor %d at %s serves shuffle %r, this reader wants %r",
                    index,
                    location,
                    told.get("mode"),
                    self.shuffle,
                )
                stop.wait(self.retry * 10)
                return
            with self._lock:  # it may have restarted with its start-up share: the watcher deals again
                self._owned[index] = list(told.get("partitions", []))
            self._merge(told.get("all") or [])
            self._deal(self.locations())
            while not stop.is_set():
                got = client.pop_tagged(self.pull_rows, self.lane)
                self._empty[index] = got is None
                if got is None:
                    continue
                client.action("ack", {"position": past(got[1], got[2]), "lane": self.rank})  # ours now
                fresh = self._accept(*got)
                if fresh is None:
                    continue
                batch, keys, offsets = fresh
                while not buffer.put(batch, (keys, offsets), timeout=0.2):
                    if stop.is_set():
                        return
        except BufferClosed:
            return
        except ERRORS as exc:
            self.reconnects += 1
            log.warning("executor %d at %s: %s; reconnecting", index, location, exc)
            self._failed(exc)
            stop.wait(self.retry)
        finally:
            self._empty[index] = False
            if client is not None:
                client.close()

    def _accept(
        self, batch: pa.RecordBatch, keys: list[str], offsets: np.ndarray
    ) -> tuple[pa.RecordBatch, list[str], np.ndarray] | None:
        """The rows past what was accepted already (per partition), and move the marks."""
        with self._lock:
            if self.size > 1 and self.lane is None and self._universe is not None:
                # forward: another rank's partitions (an executor's start-up share) never come here
                mine = np.isin(np.asarray(keys, dtype=object), self._universe)
                if not mine.all():
                    if not mine.any():
                        return None
                    rows = np.flatnonzero(mine)
                    batch, keys, offsets = batch.take(pa.array(rows)), [keys[i] for i in rows], offsets[rows]
            unique = set(keys)
            if len(unique) == 1:
                keep = self._fresh(keys[0], offsets)
            else:
                names = np.asarray(keys, dtype=object)
                keep = np.zeros(len(keys), bool)
                for key in unique:
                    rows = np.flatnonzero(names == key)
                    keep[rows] = self._fresh(key, offsets[rows])
        dropped = len(keep) - int(keep.sum())
        if dropped == 0:
            return batch, keys, offsets
        self.duplicates += dropped
        if dropped == len(keep):
            return None
        index = np.flatnonzero(keep)
        return batch.take(pa.array(index)), [keys[i] for i in index], offsets[index]

    def _fresh(self, key: str, offsets: np.ndarray) -> np.ndarray:
        """Which rows (in order) lie past the accepted mark and every earlier row; moves the mark."""
        mark = self._fetched.get(key, -1)
        before = np.maximum.accumulate(np.concatenate([[mark - 1], offsets[:-1]]))
        self._fetched[key] = max(mark, int(offsets.max()) + 1)
        return offsets > np.maximum(before, mark - 1)

    def _merge(self, every: list[str]) -> None:
        """Take an executor's list of the stream's partitions: the first sets the dealing order,
        later ones only append the partitions added since (in their order)."""
        if not every:
            return
        with self._lock:
            if self._all is None:
                self._all = list(every)
            else:
                known = set(self._all)
                added = [k for k in every if k not in known]
                if not added:
                    return
                log.info("partitions %s added to the stream: dealt from now on", added)
                self._all += added
                self._added |= set(added)
            self._universe = list(self._all) if self.lane is not None else self._all[self.rank :: self.size]

    def _follow_partitions(self, locations: dict[int, str]) -> None:
        """Every ``universe_every`` s the dealing reader asks its attached executors which partitions
        the stream has now."""
        if time.monotonic() - self._listed < self.universe_every or (self.lane is not None and self.rank != 0):
            return
        self._listed = time.monotonic()
        with self._lock:
            attached = [locations[i] for i in self._owned if i in locations]
        for location in attached:
            told = self._call(location, "partitions", {})
            if told is not None:
                self._merge(list(told.get("all") or []))

    def _deal(self, locations: dict[int, str]) -> None:
        """Deal this rank's partitions over the attached executors (index order, every n-th), each
        told its share with the marks to start gained partitions at; losers first. An executor gone
        for ``takeover_after`` seconds leaves the membership."""
        with self._deal_lock:
            now = time.monotonic()
            for index in locations:
                self._seen[index] = now
            with self._lock:
                for index in [i for i in self._owned if now - self._seen.get(i, now) >= self.takeover_after]:
                    log.warning("executor %d gone: its partitions %s go to the others", index, self._owned[index])
                    del self._owned[index]
                    self.takeovers += 1
                for index in [i for i in self._empty if i not in self._owned and i not in locations]:
                    del self._empty[index]  # left for good: not waited for at the live edge
                owned, universe = dict(self._owned), self._universe
            if universe is None or not owned or (self.lane is not None and self.rank != 0):
                return  # in rebalance mode rank 0 deals for all
            members = sorted(set(owned) | set(locations))  # one found but not attached yet gets its share soon
            share = {m: sorted(universe[k :: len(members)]) for k, m in enumerate(members)}
            changed = [m for m in owned if m in locations and sorted(owned[m]) != share[m]]
            for m in sorted(changed, key=lambda m: not set(share[m]) <= set(owned[m])):  # losers first
                with self._lock:
                    position = {k: self._fetched[k] for k in share[m] if k in self._fetched}
                    new = [k for k in share[m] if k in self._added]
                body = {"partitions": share[m], "position": position, "new": new}
                told = self._call(locations[m], "assign", body)
                if told is not None:
                    with self._lock:
                        if m in self._owned:
                            self._owned[m] = list(told["partitions"])
                    self.assignments += 1

    def _call(self, location: str, action: str, body: dict) -> dict | None:
        try:
            client = self._client(location)
            try:
                return client.action(action, body)
            finally:
                client.close()
        except ERRORS as exc:
            log.warning("%s at %s failed: %s", action, location, exc)
            self._failed(exc)
            return None

    def _stop_pullers(self) -> None:
        self._stop.set()
        self.buffer.close()
        for thread in [self._watcher, *self._pullers.values()]:
            if thread is not None:
                thread.join(self.call_timeout)
        self._pullers, self._watcher = {}, None
        self._stop = threading.Event()

    # -- StreamReader ----------------------------------------------------------------------
    def poll(self, max_rows: int, timeout: float) -> pa.RecordBatch | None:
        self._ensure_started()
        got = self.buffer.pop_tagged(max_rows, timeout=timeout)
        if got is None:
            self.last_offsets = ([], np.empty(0, np.int64))
            return None
        batch, keys, offsets = got
        self.last_offsets = (keys, offsets)
        return batch

    def at_live_edge(self) -> bool:
        """Nothing waits here and every executor's last answer was empty."""
        return len(self.buffer) == 0 and bool(self._empty) and all(self._empty.values())

    def position(self) -> dict[str, int]:
        return {**self._start, **self.buffer.consumed_position()}

    def seek(self, position: Position) -> None:
        """Resume at ``position`` (a checkpoint's): the executors are rewound to it on attach."""
        self._stop_pullers()
        self._start = {str(k): int(v) for k, v in position.items()}
        with self._lock:
            self._fetched = dict(self._start)
        self.buffer = SampleBuffer(self.buffer_rows)

    def commit(self, position: Position) -> None:
        """Commit ``position`` through every executor (each commits its own partitions)."""
        wanted = {str(k): int(v) for k, v in position.items()}
        body = {"position": wanted, "lane": self.rank, "lanes": self.size}
        done: set[str] = set()
        for index, location in sorted(self.locations().items()):
            try:
                client = self._client(location)
                try:
                    done |= set(client.action("commit", body)["committed"])
                finally:
                    client.close()
            except ERRORS as exc:
                self._failed(exc)
                self.commit_failures += 1
                log.warning(
                    "commit through executor %d at %s failed (the next checkpoint commits): %s", index, location, exc
                )
        missing = sorted(set(wanted) - done)
        if missing and self.lane is None:  # rebalance: an offset is committed once every rank committed it
            log.warning("offsets of %s not committed this time (executor down)", missing)

    def executor_stats(self, action: str = "stats") -> dict[int, dict]:
        out = {}
        for index, location in sorted(self.locations().items()):
            client = self._client(location)
            try:
                out[index] = client.action(action)
            finally:
                client.close()
        return out

    def lag(self) -> dict[str, int]:
        """Kafka consumer lag of every executor's partitions."""
        return {k: v for stats in self.executor_stats("lag").values() for k, v in stats["lag"].items()}

    def close(self) -> None:
        self._stop_pullers()
