"""Stream data executors: never-ending task runners, one per topic-partition, feeding sample buffers.

Two loading modes (``stream.shuffle``):
- forward: each executor's runners put what they fetch into that executor's own buffer; a
  slow or skewed partition starves the trainer reading that buffer.
- rebalance: runners put fetched batches on a shared exchange; every executor pulls from it
  whenever its buffer has room, so data flows to whoever consumes, and one slow partition
  no longer holds a trainer back. (In one process the exchange is a queue; between hosts the
  buffers are served over Arrow Flight, see primus_lib.data.flight.)
Offsets travel with the rows, so ``safe_position()`` can say, per partition, the offset below
which every row has been popped by some trainer: what a checkpoint may commit (with several
buffers in rebalance mode a row may still wait in another buffer or in the exchange).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from primus_lib.data.buffer import BufferClosed, SampleBuffer
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.stream import StreamReader

Transform = Callable[[pa.RecordBatch], pa.RecordBatch]


@dataclass
class RunnerStats:
    batches: int = 0
    rows: int = 0
    errors: list[str] = field(default_factory=list)


class StreamGroup:
    """The stream executors of one stream: readers (one per partition) assigned round-robin."""

    def __init__(
        self,
        readers: dict[str, StreamReader],
        buffers: list[SampleBuffer],
        *,
        mode: str = "forward",
        poll_rows: int = 1024,
        poll_timeout: float = 0.2,
        exchange_batches: int = 16,
        transform: Transform | None = None,
        ledger: TaskLedger | None = None,
        stream: str = "stream",
        executor_ids: list[str] | None = None,
        metrics: list | None = None,
    ):
        if mode not in ("forward", "rebalance"):
            raise ValueError(f"stream loading mode must be 'forward' or 'rebalance', got {mode!r}")
        if not buffers:
            raise ValueError("at least one executor buffer is needed")
        if metrics is not None and len(metrics) != len(buffers):
            raise ValueError(f"metrics: expected one ExecutorMetrics per buffer ({len(buffers)}), got {len(metrics)}")
        self.readers, self.buffers, self.mode = readers, buffers, mode
        self.poll_rows, self.poll_timeout = poll_rows, poll_timeout
        self.transform = transform
        names = sorted(readers)
        self.assignment = {name: i % len(buffers) for i, name in enumerate(names)}
        self.exchange: queue.Queue = queue.Queue(maxsize=exchange_batches)
        self.stats = {name: RunnerStats() for name in names}
        self.delivered = [0] * len(buffers)
        self.ledger, self.stream = ledger, stream
        self.executor_ids = executor_ids or [f"{stream}-executor-{i}" for i in range(len(buffers))]
        self.metrics = metrics  # one primus_lib.metrics.ExecutorMetrics per buffer: its fill for the scaler
        self._stop = threading.Event()
        self._lock = threading.Lock()  # exchange hand-offs vs safe_position()
        self._inflight: dict[int, tuple[list[str], object]] = {}
        self._runners: list[threading.Thread] = []
        self._dispatchers: list[threading.Thread] = []

    def start(self) -> StreamGroup:
        if self.ledger is not None:  # stream tasks are only assigned or not
            for name, index in self.assignment.items():
                self.ledger.assign_stream(self.stream, name, self.executor_ids[index])
        for name in self.readers:
            self._runners.append(self._spawn(self._run_partition, name, f"stream-runner-{name}"))
        if self.mode == "rebalance":
            for i in range(len(self.buffers)):
                self._dispatchers.append(self._spawn(self._dispatch, i, f"stream-dispatch-{i}"))
        return self

    @staticmethod
    def _spawn(target, arg, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, args=(arg,), name=name, daemon=True)
        thread.start()
        return thread

    def _run_partition(self, name: str) -> None:
        reader, stats = self.readers[name], self.stats[name]
        own = self.buffers[self.assignment[name]]
        try:
            while not self._stop.is_set():
                batch = reader.poll(self.poll_rows, self.poll_timeout)
                if batch is None:
                    if reader.end_of_data():
                        return
                    continue
                offsets = getattr(reader, "last_offsets", None)
                if self.transform is not None:
                    batch = self.transform(batch)
                stats.batches += 1
                stats.rows += batch.num_rows
                if self.mode == "forward":
                    while not own.put(batch, offsets, timeout=0.2):
                        if self._stop.is_set():
                            return
                    self.delivered[self.assignment[name]] += batch.num_rows
                    self.observe_buffer(self.assignment[name])
                else:
                    while not self._stop.is_set():
                        try:
                            self.exchange.put((batch, offsets), timeout=0.2)
                            break
                        except queue.Full:
                            continue
        except BufferClosed:
            return
        except Exception as exc:
            stats.errors.append(f"{type(exc).__name__}: {exc}")

    def _dispatch(self, index: int) -> None:
        """Rebalance: pull fetched batches into this executor's buffer whenever it has room."""
        buffer = self.buffers[index]
        while not self._stop.is_set():
            with self._lock:  # taken off the exchange and marked in flight in one step
                try:
                    batch, offsets = self.exchange.get_nowait()
                except queue.Empty:
                    batch = None
                else:
                    self._inflight[index] = offsets
            if batch is None:
                time.sleep(0.005)
                continue
            try:
                while not buffer.put(batch, offsets, timeout=0.2):
                    if self._stop.is_set():
                        return
            except BufferClosed:
                return
            finally:
                with self._lock:
                    self._inflight.pop(index, None)
            self.delivered[index] += batch.num_rows
            self.observe_buffer(index)

    def observe_buffer(self, index: int) -> None:
        """Set executor ``index``'s buffer-fill gauge (once per delivered batch, not per row; the
        trainers' pops show at the next one, or call it from a reporting loop)."""
        if self.metrics is None:
            return
        try:
            buffer = self.buffers[index]
            self.metrics[index].observe_buffer(buffer.utilisation, 1.0)
        except Exception:  # metrics never stop a runner
            return

    def safe_position(self) -> dict[str, int]:
        """Per partition, the offset below which every fetched row was popped by a trainer."""
        with self._lock:
            waiting = [o for _, o in list(self.exchange.queue)] + list(self._inflight.values())
            pending: dict[str, int] = {}
            for offsets in waiting:
                if offsets is None or not len(offsets[1]):
                    continue
                keys, offs = offsets
                for key, low in zip(keys[:1], offs[:1], strict=True):  # one partition per fetched batch
                    pending[key] = min(pending.get(key, int(low)), int(low))
            for buffer in self.buffers:
                for key, low in buffer.pending_start().items():
                    pending[key] = min(pending.get(key, low), low)
        consumed: dict[str, int] = {}
        for buffer in self.buffers:
            for key, high in buffer.consumed_position().items():
                consumed[key] = max(consumed.get(key, high), high)
        return {key: pending.get(key, high) for key, high in consumed.items()}

    def errors(self) -> list[str]:
        return [f"{name}: {e}" for name, s in self.stats.items() for e in s.errors]

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for thread in self._runners + self._dispatchers:
            thread.join(timeout)
        if self.ledger is not None:
            for executor in self.executor_ids:
                self.ledger.unassign_executor(executor)

    def finished(self) -> bool:
        """All partition runners ended (bounded replays only) and nothing waits in the exchange."""
        return all(not t.is_alive() for t in self._runners) and self.exchange.empty()
