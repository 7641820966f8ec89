"""The trainer's sample buffers and the mixed-data priority rule, row by row.

One buffer per data stream. A buffer is *ready* when it holds a full minibatch, or, once
its source is exhausted or *drained*, whatever is left (a smaller final minibatch, like
``drop_last=False``). A batch buffer is drained when every row it holds belongs to a window
read completely and the next window is not available yet (see ``inputs.Inputs.read``): its
window then completes instead of waiting for the next window's rows.

Each ready buffer's priority is ``p_i = w_i * sigmoid(q_i)``: ``w_i`` the stream's importance
(``spec.training.priority``, default 1), ``q_i`` its queued rows measured in minibatches
(``rows / batch_size``), so the sigmoid saturates over a few minibatches instead of after a handful
of rows. The priority is a share of rows, not a winner (``RowShare``): every row served owes each
ready buffer ``p_i / sum_j p_j`` of a row, and the buffer owed the most serves the next minibatch.
Over any few minibatches the rows are drawn across buffers in proportion to their priorities, a
stream surge raises the stream's share (its queue grows) and a buffer that holds rows is never
starved. Minibatches stay of one kind each: Algorithm 1 runs one tower's graph per minibatch.

Buffer lengths, lag behind event time and rows served per stream are Prometheus metrics in
the registry passed in, read from the reader when collected (``ReaderMetrics``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from primus_lib.train.model.batch import Block, Cut

if TYPE_CHECKING:
    from primus_lib.train.model.batch import Prepared


def priority(weight: float, queued_rows: float, batch_size: int) -> float:
    """``w * sigmoid(q)`` with ``q`` in minibatches."""
    q = queued_rows / batch_size
    return weight / (1.0 + math.exp(-q))


class RowShare:
    """Rows owed to each ready buffer in proportion to its priority (a deficit round robin by rows).

    Every data-parallel rank feeds it the same agreed priorities, so every rank picks the same buffer."""

    def __init__(self) -> None:
        self.owed: dict[str, float] = {}

    def pick(self, priorities: dict[str, float]) -> str | None:
        """The ready buffer owed the most rows (ties: the higher priority, then the first listed)."""
        for name in [n for n in self.owed if n not in priorities]:
            del self.owed[name]  # not ready: it is owed nothing (no burst when it comes back)
        if not priorities:
            return None
        return max(priorities, key=lambda n: (self.owed.get(n, 0.0), priorities[n]))

    def served(self, name: str, rows: int, priorities: dict[str, float]) -> None:
        """``rows`` went to ``name``: each ready buffer earns its share of them."""
        total = sum(priorities.values())
        if total <= 0:
            return
        for other, p in priorities.items():
            self.owed[other] = self.owed.get(other, 0.0) + rows * p / total
        self.owed[name] = self.owed.get(name, 0.0) - rows


class ReaderMetrics(Collector):
    """The buffers' rows, the lag behind event time of the newest row served and the rows served,
    per stream, read from the reader when the registry is collected (a scrape, a snapshot), not set
    at every step: no locked updates in the training loop, and the lag of a trainer that stops
    serving grows instead of staying at its last minibatch's."""

    def __init__(self, reader: PriorityReader, registry: CollectorRegistry) -> None:
        self.reader = reader
        registry.register(self)

    def collect(self):
        reader = self.reader
        rows = GaugeMetricFamily("primus_trainer_buffer_rows", "Rows queued in the trainer's buffer", labels=["stream"])
        lag = GaugeMetricFamily(
            "primus_trainer_event_lag_seconds",
            "Clock time minus the event time of the newest row served",
            labels=["stream"],
        )
        served = CounterMetricFamily("primus_trainer_rows_served", "Rows handed to training steps", labels=["stream"])
        now = reader.clock()
        for name, buffer in reader.buffers.items():
            rows.add_metric([name], buffer.rows)
            served.add_metric([name], reader.served[name])
            newest = reader.newest_ms.get(name)
            if newest is not None:
                lag.add_metric([name], now - newest / 1000.0)
        return [rows, lag, served]


class Piece:
    """Rows of a buffer: a ``cut`` of the table they were pushed in, whose columns are converted once
    for all its pieces (``batch.Block``), and those rows as a ``table``. A full minibatch's piece may
    carry what the prefetch thread prepared from its rows (``prepared``), so that the training thread
    only runs the step."""

    __slots__ = ("cut", "table", "prepared", "wanted")

    def __init__(self, cut: Cut):
        self.cut = cut
        self.table: pa.Table = cut.block.table.slice(cut.start, cut.num_rows)
        self.prepared: Prepared | None = None
        self.wanted = True  # still in its buffer: worth preparing


class Buffer:
    """Rows of one data stream waiting to be trained, in arrival order.

    With ``align`` (the minibatch size: the training buffers) rows are cut into pieces of one
    minibatch each, counted from the head (minibatches are served from the head, a smaller one
    only when it empties the buffer), and every full piece is queued in ``unbuilt`` for the
    prefetch thread to prepare; the rows stay in the buffer (and in a checkpoint's pending rows)
    until served."""

    def __init__(self, name: str, kind: str, weight: float, ts_column: str, align: int = 0):
        self.name = name
        self.kind = kind
        self.weight = weight
        self.ts_column = ts_column
        self.align = align
        self.chunks: deque[Piece] = deque()
        self.unbuilt: deque[Piece] = deque()  # full pieces to prepare (thread-safe appends/pops)
        self.rows = 0
        self.exhausted = False  # the source will add nothing more
        self.drained = False  # the source has nothing more now and every queued row's window is fully read

    def push(self, table: pa.Table | pa.RecordBatch) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not table.num_rows:
            return
        self.rows += table.num_rows
        size = self.align
        if not size:
            self.chunks.append(Piece(Cut(Block(table))))
            return
        if self.chunks and self.chunks[-1].table.num_rows < size:  # complete the partial tail
            tail = self.chunks.pop()
            table = pa.concat_tables([tail.table, table])
        block = Block(table)  # its minibatches convert each column once (``batch.Block``)
        for start in range(0, table.num_rows, size):
            piece = Piece(Cut(block, start, min(size, table.num_rows - start)))
            self.chunks.append(piece)
            if piece.table.num_rows == size:
                self.unbuilt.append(piece)

    def take(self, n: int) -> tuple[pa.Table, Piece | None]:
        """Pop ``n`` rows from the head, with their piece when they are exactly one (else None)."""
        head = self.chunks[0] if self.chunks else None
        if head is not None and head.table.num_rows == n:
            self.chunks.popleft()
            head.wanted = False
            self.rows -= n
            return head.table, head
        return self.pop(n), None

    def pop(self, n: int) -> pa.Table:
        parts, need = [], n
        while need and self.chunks:
            head = self.chunks[0]
            head.wanted = False
            if head.table.num_rows <= need:
                parts.append(self.chunks.popleft().table)
                need -= head.table.num_rows
            else:
                parts.append(head.table.slice(0, need))
                rest = Cut(head.cut.block, head.cut.start + need, head.cut.num_rows - need)
                self.chunks[0] = Piece(rest)  # off the minibatch grid: not prepared
                need = 0
        taken = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        self.rows -= taken.num_rows
        return taken

    def next_unbuilt(self) -> Piece | None:
        """The oldest full piece still in the buffer and not prepared (the prefetch thread)."""
        while True:
            try:
                piece = self.unbuilt.popleft()
            except IndexError:
                return None
            if piece.wanted:
                return piece

    def pending(self) -> pa.Table | None:
        """Everything queued (for the checkpoint), without removing it."""
        return pa.concat_tables([p.table for p in self.chunks]) if self.chunks else None

    def full(self, batch_size: int) -> bool:
        """A full minibatch, or the remainder of a source that will add nothing more."""
        return self.rows >= batch_size or (self.exhausted and self.rows > 0)

    def ready(self, batch_size: int) -> bool:
        return self.full(batch_size) or (self.drained and self.rows > 0)


class PriorityReader:
    """Chooses the buffer of the next minibatch and serves its rows."""

    def __init__(
        self,
        buffers: list[Buffer],
        batch_size: int,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.buffers = {b.name: b for b in buffers}
        self.batch_size = batch_size
        self.clock = clock
        self.served: dict[str, int] = {b.name: 0 for b in buffers}
        self.newest_ms: dict[str, float] = {}  # the event time of the newest row served, per buffer
        self.share = RowShare()
        self.chosen: dict[str, float] = {}  # the ready buffers' priorities at the last choice
        self.metrics = ReaderMetrics(self, registry or CollectorRegistry())

    def priorities(self, only: set[str] | None = None) -> dict[str, float]:
        """``p_i`` of every ready buffer (among ``only``, when given)."""
        return {
            b.name: priority(b.weight, b.rows, self.batch_size)
            for b in self.buffers.values()
            if (only is None or b.name in only) and b.ready(self.batch_size)
        }

    def choose(self, only: set[str] | None = None) -> Buffer | None:
        """The ready buffer owed the most rows (``RowShare``), among ``only`` when given."""
        self.chosen = self.priorities(only)
        name = self.share.pick(self.chosen)
        return self.buffers[name] if name is not None else None

    def next_minibatch(self, only: set[str] | None = None) -> tuple[Buffer, pa.Table] | None:
        buffer = self.choose(only)
        if buffer is None:
            return None
        return buffer, self.serve(buffer.name, min(self.batch_size, buffer.rows))

    def serve(self, name: str, n: int) -> pa.Table:
        """Pop ``n`` rows of buffer ``name`` (the data-parallel trainer decides which buffer)."""
        return self.take(name, n)[0]

    def take(self, name: str, n: int) -> tuple[pa.Table, Piece | None]:
        """``serve``, with the rows' piece when they are exactly one (what the prefetch thread prepared)."""
        buffer = self.buffers[name]
        rows, piece = buffer.take(n)
        self.share.served(name, rows.num_rows, self.chosen or {name: 1.0})
        self.served[buffer.name] += rows.num_rows
        if rows.num_rows:
            newest = getattr(piece.prepared, "newest_ms", None) if piece is not None else None
            if newest is None:
                ts = piece.cut.view(buffer.ts_column) if piece is not None else rows.column(buffer.ts_column).to_numpy()
                newest = ts.max()
            self.newest_ms[buffer.name] = float(newest)
        return rows, piece

    def prepare_next(self, prepare: Callable[[str, Piece], Prepared]) -> Callable[[], bool]:
        """For the prefetch thread: prepare the oldest unprepared minibatch of each buffer with
        ``prepare(kind, piece)``; False when there was none. A failure leaves the minibatch to the
        training thread, which raises it."""

        def step() -> bool:
            found = False
            for buffer in self.buffers.values():
                piece = buffer.next_unbuilt()
                if piece is not None:
                    found = True
                    with contextlib.suppress(Exception):
                        piece.prepared = prepare(buffer.kind, piece)
            return found

        return step
