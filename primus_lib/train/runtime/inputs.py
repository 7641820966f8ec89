"""The trainer's input side: feeds -> staging buffers (prefetch thread) -> training buffers.

Batch-lag rule: a batch window ``[s, s+w)`` is read only once the stream's position (the
``watermark`` the coordinator agrees on) has reached ``s + lag``, i.e. while the stream is at
window ``t`` only batch windows up to ``t - lag`` are trained, as production sees it. With no
stream in the mode, or once a bounded stream has ended, the rule is off.

Window completion: a batch window's last rows usually do not fill a minibatch. They are
trained with the next window's rows when that window is available; when it is not (not in
the queue yet, or held back by the batch-lag rule, ``until``, the timer end, the mode switch)
and every buffered row's window has been read completely for ``flush_grace`` seconds with
nothing new read, the buffer is *drained* and its rows may go as one smaller minibatch.

A feed's cursor and the rows it produced are staged together under ``lock``, so a checkpoint
(which takes the lock) never sees one without the other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry

from primus_lib.data.stream import StreamReader
from primus_lib.data.training_queue import QueuedWindow, TrainingQueue
from primus_lib.spec.job import PrimusJob
from primus_lib.storage import StorageLocation, locate
from primus_lib.train.model.modes import reads, switches
from primus_lib.train.model.row_keys import with_keys
from primus_lib.train.runtime.feeds import BatchFeed, StreamFeed, window_start_ms
from primus_lib.train.runtime.priority import Buffer, PriorityReader

NEVER = -(2**62)


@dataclass(frozen=True)
class Limits:
    """Where reading stops: ``until`` (window start), the mode switch, the timer end (epoch ms)."""

    until_ms: int | None
    switch_ms: int | None
    lag_ms: int
    end_ms: int | None
    window_ms: int


class Inputs:
    """Feeds, staging and training buffers of one trainer process (one rank)."""

    def __init__(
        self,
        job: PrimusJob,
        mode: str,
        limits: Limits,
        readers: dict[str, list[StreamReader]],
        registry: CollectorRegistry,
        *,
        rank: int = 0,
        size: int = 1,
        high_water: int = 4,
        flush_grace: float = 2.0,
        queue: TrainingQueue | None = None,
        where: Callable[[str], StorageLocation] = locate,
        clock: Callable[[], float] = time.time,
    ):
        spec = job.spec
        self.ts = spec.features.timestamp
        self.batch_size = spec.training.batch_size
        self.limits = limits
        self.high = high_water * self.batch_size
        self.flush_grace = flush_grace
        self.clock = clock
        self.watermark: Callable[[], int | None] = self.local_watermark  # a data-parallel coordinator replaces it
        weights = spec.training.priority
        buffers: list[Buffer] = []
        self.batch_feeds: dict[str, BatchFeed] = {}
        self.stream_feeds: dict[str, list[StreamFeed]] = {}
        if reads(mode, "batch"):
            for stream in job.batch_streams:
                if queue is None:
                    raise ValueError(
                        f"batch stream {stream.name!r}: mode {mode!r} reads it, but no training queue was given"
                    )
                self.batch_feeds[stream.name] = BatchFeed(queue, stream.name, stream.lag, self.ts, rank, size, where)
                buffers.append(Buffer(stream.name, "batch", weights.get(stream.name, 1.0), self.ts))
        self.gates_batch = reads(mode, "stream") and not switches(mode)
        if reads(mode, "stream"):
            keep_from = limits.switch_ms - limits.lag_ms if limits.switch_ms is not None else None
            for stream in job.stream_streams:
                self.stream_feeds[stream.name] = [
                    StreamFeed(stream.name, r, self.ts, keep_from) for r in readers.get(stream.name, [])
                ]
                buffers.append(Buffer(stream.name, "stream", weights.get(stream.name, 1.0), self.ts))
        self.reader = PriorityReader(buffers, self.batch_size, registry)
        self.staging = {b.name: Buffer(b.name, b.kind, b.weight, b.ts_column) for b in buffers}
        self.staged_seqs: list[int] = []
        self.stalled_since: dict[str, float | None] = {name: None for name in self.batch_feeds}
        self.lock = threading.Lock()
        self.ids: str | None = None  # the rows' id column, when steps need its keys: hashed as rows are read
        self.partitionless = size > 1  # a rank that owns no partition of a stream will never read any

    # -- the stream's position ----------------------------------------------------------
    def all_stream_feeds(self) -> list[StreamFeed]:
        return [f for fs in self.stream_feeds.values() for f in fs]

    def stream_live(self) -> bool:
        """Every stream source is at its live edge (a poll found nothing new): waiting now is idle
        time of a caught-up trainer, not starvation (``InputMetrics.end``)."""
        feeds = self.all_stream_feeds()
        return bool(feeds) and all(f.caught_up for f in feeds)

    def local_watermark(self) -> int | None:
        """Where this process's stream is in time; None when no stream gates the batch.

        The newest event time read; once every source has caught up (a poll found nothing
        new), the stream's present is the clock, so a stream that simply has no newer events
        (a finished demo topic, a quiet night) does not hold the batch back forever.
        """
        feeds = self.all_stream_feeds()
        if not feeds or not self.gates_batch or all(f.ended() for f in feeds):
            return None
        mark = max(f.watermark_ms for f in feeds)
        if all(f.caught_up for f in feeds):
            mark = max(mark, int(self.clock() * 1000))
        return mark

    # -- reading (prefetch thread or inline, under ``lock``) ------------------------------
    def admit(self, window: QueuedWindow) -> bool:
        start = window_start_ms(window.window)
        limits = self.limits
        if limits.until_ms is not None and start > limits.until_ms:
            return False
        if limits.switch_ms is not None and start >= limits.switch_ms - limits.lag_ms:
            return False  # offline_then_online: the stream takes over from here
        return limits.end_ms is None or start < limits.end_ms

    def read(self) -> bool:
        """Read from the feeds into the staging buffers up to the high-water mark."""
        arrived = False
        for name, feeds in self.stream_feeds.items():
            staged = self.staging[name]
            for feed in feeds:
                while staged.rows + self.reader.buffers[name].rows < self.high:
                    table = feed.read(self.high, 0.05)
                    if table is None:
                        break
                    staged.push(with_keys(table, self.ids))
                    arrived = True
            staged.exhausted = all(f.ended() for f in feeds) if feeds else self.partitionless
        mark = self.watermark()
        for name, batch_feed in self.batch_feeds.items():
            staged = self.staging[name]
            got = stalled = False
            while staged.rows + self.reader.buffers[name].rows < self.high:
                table = batch_feed.read(lambda at: mark is None or mark >= at, self.admit)
                if table is None:  # nothing may be read now; stalled if no window is half read
                    stalled = batch_feed.seq == batch_feed.done_seq
                    break
                self.staged_seqs.append(batch_feed.seq)
                staged.push(with_keys(table, self.ids))
                arrived = got = True
            staged.exhausted = self.batch_finished(batch_feed)
            staged.drained = self.drained(name, stalled, got)
        return arrived

    def drained(self, name: str, stalled: bool, got: bool) -> bool:
        """Every row read of stream ``name`` belongs to a fully read window and no further
        window could be read for ``flush_grace`` seconds: its remainder may go as a partial step."""
        now = time.monotonic()
        if not stalled:
            self.stalled_since[name] = None
            return False
        since = self.stalled_since[name]
        if got or since is None:  # the grace period runs from the last row read
            self.stalled_since[name] = since = now
        return now - since >= self.flush_grace

    def batch_finished(self, feed: BatchFeed) -> bool:
        window = feed.next_window()
        if window is not None:
            return not self.admit(window)
        last = feed.windows.get(feed.done_seq)
        if last is None:
            return False
        start = window_start_ms(last.window)
        limits = self.limits
        if limits.until_ms is not None and start >= limits.until_ms:
            return True
        return limits.end_ms is not None and start + limits.window_ms >= limits.end_ms

    def transfer(self) -> list[tuple[BatchFeed, int]]:
        """Move staged rows into the training buffers (caller holds ``lock``); returns the
        (feed, queue seq) of every batch window that started arriving, for the accounting."""
        started = [(feed, seq) for seq in self.staged_seqs for feed in self.batch_feeds.values()]
        self.staged_seqs.clear()
        for name, staged in self.staging.items():
            buffer = self.reader.buffers[name]
            if staged.chunks:
                while staged.chunks:
                    buffer.push(staged.chunks.popleft().table)
            staged.rows = 0
            buffer.exhausted = staged.exhausted
            buffer.drained = staged.drained
        return started

    def align(self) -> None:
        """Cut the training buffers into minibatch pieces for the prefetch thread to prepare
        (one process: minibatches are always served whole from a buffer's head)."""
        for buffer in self.reader.buffers.values():
            buffer.align = self.batch_size

    # -- state --------------------------------------------------------------------------
    def all_done(self) -> bool:
        """Every source is exhausted and every row read is trained."""
        return all(b.exhausted and b.rows == 0 for b in self.reader.buffers.values()) and not any(
            s.rows for s in self.staging.values()
        )

    def batch_phase_over(self) -> bool:
        """offline_then_online: every batch buffer is exhausted and empty."""
        return all(self.reader.buffers[n].exhausted and self.reader.buffers[n].rows == 0 for n in self.batch_feeds)

    def nothing_staged(self) -> bool:
        """No staged rows, windows or end-of-source flags wait to be moved (``transfer``). Read without
        the lock: a hint, which the next look corrects (only ``transfer`` moves them, under the lock)."""
        buffers = self.reader.buffers
        return not self.staged_seqs and all(
            not s.rows and s.exhausted == buffers[n].exhausted and s.drained == buffers[n].drained
            for n, s in self.staging.items()
        )

    def any_full(self) -> bool:
        return any(b.full(self.batch_size) for b in self.reader.buffers.values())

    def queues_full(self) -> bool:
        """Every buffer that can still receive rows holds its read-ahead (high water)."""
        live = [name for name, buffer in self.reader.buffers.items() if not buffer.exhausted]
        return bool(live) and all(self.staging[n].rows + self.reader.buffers[n].rows >= self.high for n in live)

    def stream_horizon(self, name: str) -> int:
        """Event time before which every row of stream ``name`` read here is trained."""
        buffer = self.reader.buffers[name]
        pending = buffer.pending()
        if pending is not None:  # rows before the oldest untrained one are all trained
            return int(pc.min(pending.column(self.ts)).as_py())
        if buffer.exhausted:
            return 2**62
        # everything read is trained; events arrive in event-time order
        return max((f.watermark_ms for f in self.stream_feeds[name]), default=NEVER)

    def position(self) -> dict:
        """The feeds' cursors (caller holds ``lock``)."""
        return {
            "batch": {n: f.position() for n, f in self.batch_feeds.items()},
            "stream": {n: [f.position() for f in fs] for n, fs in self.stream_feeds.items()},
            "served": self.reader.served,
        }

    def pending(self) -> dict[str, pa.Table | None]:
        """Rows read but not trained, per buffer (checkpointed with the cursors)."""
        return {name: buffer.pending() for name, buffer in self.reader.buffers.items()}

    def seek(self, pos: dict, pending: dict[str, pa.Table | None]) -> None:
        """Seek the feeds and refill the buffers with the rows read but not trained."""
        for name, batch_feed in self.batch_feeds.items():
            batch_feed.seek(pos["batch"][name])
            batch_feed.next_window()
        for name, feeds in self.stream_feeds.items():
            for feed, saved in zip(feeds, pos["stream"][name], strict=True):
                feed.seek(saved)
        for name, table in pending.items():
            if table is not None:
                self.reader.buffers[name].push(with_keys(table, self.ids, rehash=True))
        self.reader.served.update(pos.get("served", {}))

    def commit(self, stream_position: dict[str, list[dict]]) -> None:
        """Commit stream offsets to their sources: only once a checkpoint covering them is durable."""
        for name, feeds in self.stream_feeds.items():
            for feed, saved in zip(feeds, stream_position[name], strict=True):
                feed.reader.commit(saved["offsets"])

    def close(self) -> None:
        for feed in self.all_stream_feeds():
            feed.reader.close()
