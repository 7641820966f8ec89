"""Where the trainer's buffers get rows: committed batch windows in queue order, and streams.

Both feeds keep a cursor that only moves past rows they have handed to a buffer; together
with the buffers' pending rows (saved in the checkpoint) that is the exact data position.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_lib.data.shards import Manifest, read_manifest, read_shard
from primus_lib.data.stream import StreamReader
from primus_lib.data.training_queue import QueuedWindow, TrainingQueue
from primus_lib.paths import parse_window_id
from primus_lib.spec.job import PrimusJob
from primus_lib.storage import StorageLocation, locate
from primus_lib.timegrid import epoch_ms
from primus_lib.train.distributed.ranks import owns_shard

SEQ_COLUMN = "__seq"  # tags batch rows with their queue entry, to know when a window is consumed


@lru_cache(maxsize=4096)
def window_start_ms(window: str) -> int:
    """A window id's start in epoch ms, parsed once: every read asks for the same few (strptime is slow)."""
    return epoch_ms(parse_window_id(window))


class BatchFeed:
    """Shards of one batch stream's committed windows, strictly in training-queue order.

    A window may be read once ``gate(window_start_ms)`` allows it (the batch-lag rule) and
    only while ``admit(window)`` accepts it (``until``/timer end/mode switch). Under a
    data-parallel trainer the feed reads only the shards its rank owns (``ranks.owns_shard``).
    """

    def __init__(
        self,
        queue: TrainingQueue,
        stream: str,
        lag: timedelta,
        ts_column: str,
        rank: int = 0,
        size: int = 1,
        where: Callable[[str], StorageLocation] = locate,
    ):
        self.queue = queue
        self.where = where  # a queued window's URI -> its location, with the job's store credentials
        self.rank = rank
        self.size = size
        self.stream = stream
        self.lag_ms = int(lag.total_seconds() * 1000)
        self.ts_column = ts_column
        self.seq = 0  # queue seq of the window being read; 0 = none yet
        self.shard = 0  # next shard of that window
        self.done_seq = 0  # last window fully read
        self.windows: dict[int, QueuedWindow] = {}
        self.peeked: tuple[int, QueuedWindow] | None = None  # (done_seq, the window after it)
        self.manifest: tuple[int, Manifest] | None = None  # (seq, the manifest of the window being read)

    def position(self) -> dict:
        return {"seq": self.seq, "shard": self.shard, "done_seq": self.done_seq}

    def seek(self, position: dict) -> None:
        self.seq, self.shard, self.done_seq = int(position["seq"]), int(position["shard"]), int(position["done_seq"])

    def next_window(self) -> QueuedWindow | None:
        if self.seq and self.seq != self.done_seq:
            return self.windows.get(self.seq) or self._lookup(self.seq)
        # every read and readiness check asks for the next window: a database round trip, unless
        # the answer is known (seqs only grow, so the first window after done_seq stays the first)
        if self.peeked is not None and self.peeked[0] == self.done_seq:
            return self.peeked[1]
        for window in self.queue.windows(self.stream, after_seq=self.done_seq):
            self.windows[window.seq] = window
            self.peeked = (self.done_seq, window)
            return window
        return None

    def _lookup(self, seq: int) -> QueuedWindow | None:
        for window in self.queue.windows(self.stream, after_seq=seq - 1):
            if window.seq == seq:
                self.windows[seq] = window
                return window
        raise RuntimeError(f"training queue lost window seq {seq} of stream {self.stream!r}")

    def read(self, gate: Callable[[int], bool], admit: Callable[[QueuedWindow], bool]) -> pa.Table | None:
        """The next shard (tagged with its window's seq), or None when none may be read yet."""
        window = self.next_window()
        if window is None or not admit(window):
            return None
        if not gate(window_start_ms(window.window) + self.lag_ms):
            return None
        manifest = self._manifest(window)
        if self.seq != window.seq:
            self.seq, self.shard = window.seq, 0
        self._skip_foreign(len(manifest.shards))
        if self.shard >= len(manifest.shards) or manifest.rows == 0:
            self.done_seq = window.seq
            return pa.table({SEQ_COLUMN: pa.array([], pa.int64())})
        info = manifest.shards[self.shard]
        table = read_shard(
            self.where(window.path), info
        )  # a local path or the s3:// / webhdfs:// URI the queue recorded
        self.shard += 1
        self._skip_foreign(len(manifest.shards))
        if self.shard >= len(manifest.shards):
            self.done_seq = window.seq
        return table.append_column(SEQ_COLUMN, pa.array(np.full(table.num_rows, window.seq, np.int64)))

    def _manifest(self, window: QueuedWindow) -> Manifest:
        """The window's manifest, read and its parts checked once per window (a committed window does
        not change; each shard's digest is checked as it is read): not once per shard."""
        if self.manifest is None or self.manifest[0] != window.seq:
            manifest = read_manifest(self.where(window.path))
            if manifest is None:
                raise FileNotFoundError(f"{window.path}: queued window {window.window} has no manifest.json")
            self.manifest = (window.seq, manifest)
        return self.manifest[1]

    def _skip_foreign(self, shards: int) -> None:
        while self.shard < shards and not owns_shard(self.shard, self.rank, self.size):
            self.shard += 1

    def expected_rows(self, window: QueuedWindow) -> int:
        """Rows of ``window`` this rank trains (all of them in a world of one)."""
        if self.size == 1:
            return window.rows
        manifest = read_manifest(self.where(window.path))
        if manifest is None:
            raise FileNotFoundError(f"{window.path}: queued window {window.window} has no manifest.json")
        return sum(s.rows for i, s in enumerate(manifest.shards) if owns_shard(i, self.rank, self.size))


class StreamFeed:
    """One stream source; tracks the event-time watermark of what it has read."""

    def __init__(self, name: str, reader: StreamReader, ts_column: str, keep_from_ms: int | None = None):
        self.name = name
        self.reader = reader
        self.ts_column = ts_column
        self.keep_from_ms = keep_from_ms  # offline_then_online: rows before the switch are not used
        self.watermark_ms = -(2**62)
        self.skipped = 0
        self.caught_up = False  # the reader is at the live edge (see read)

    def read(self, max_rows: int, timeout: float) -> pa.Table | None:
        """The next rows, or None. An empty poll means "caught up" only where the reader cannot
        tell better; a Kafka reader can: an empty poll may just be a fetch still in flight
        (or a batch of dead letters), so its high watermarks decide (``at_live_edge``)."""
        batch = self.reader.poll(max_rows, timeout)
        if batch is None or batch.num_rows == 0:
            at_live_edge = getattr(self.reader, "at_live_edge", None)
            self.caught_up = True if at_live_edge is None else bool(at_live_edge())
            return None
        self.caught_up = False
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        ts = table.column(self.ts_column)
        self.watermark_ms = max(self.watermark_ms, int(pc.max(ts).as_py()))
        if self.keep_from_ms is not None:
            keep = pc.greater_equal(ts, self.keep_from_ms)
            kept = table.filter(keep)
            self.skipped += table.num_rows - kept.num_rows
            table = kept
        return table

    def position(self) -> dict:
        return {"offsets": dict(self.reader.position()), "watermark_ms": self.watermark_ms}

    def seek(self, position: dict) -> None:
        self.reader.seek(position["offsets"])
        self.watermark_ms = int(position["watermark_ms"])

    def ended(self) -> bool:
        return self.reader.end_of_data()


def executors_serve_streams(job: PrimusJob) -> bool:
    """Whether the trainer pulls its streams from stream executors over Flight (the spec has a
    ``stream_executor`` role with replicas and its streams are Kafka topics) rather than reading the
    sources itself. File replays are read by the trainer: executors serve Kafka only."""
    from primus_lib.resources.discovery import executor_replicas

    kafka_only = all(source.kafka is not None for stream in job.stream_streams for source in stream.sources)
    return bool(job.stream_streams) and kafka_only and executor_replicas(job) > 0


def stream_readers(
    job: PrimusJob, direct: Callable[[PrimusJob], dict[str, list[StreamReader]]], rank: int = 0, size: int = 1
) -> dict[str, list[StreamReader]]:
    """The readers ``StreamFeed``s wrap: one Flight reader per stream pulling from its executors
    (this rank's share of them) when executors serve the streams, else ``direct(job)``."""
    if not executors_serve_streams(job):
        return direct(job)
    from primus_lib.data.flight_client import ExecutorStreamReader
    from primus_lib.resources.discovery import discovery_for

    for stream in job.stream_streams:
        if any(source.kafka is None for source in stream.sources):
            raise ValueError(f"stream {stream.name!r}: stream executors serve Kafka sources only")
    return {
        s.name: [ExecutorStreamReader(discovery_for(job, s.name), rank=rank, size=size, shuffle=s.shuffle)]
        for s in job.stream_streams
    }


def open_stream_readers(job: PrimusJob) -> dict[str, list[StreamReader]]:
    """Every stream source of the job through the data plane's ``open_stream``."""
    try:
        from primus_lib.data.sources import open_stream
    except ImportError as exc:
        raise RuntimeError(f"the data plane's primus_lib.data.sources.open_stream is not available: {exc}") from None
    return {s.name: [open_stream(job, s, source) for source in s.sources] for s in job.stream_streams}
