"""Reading ``primus datagen`` output straight from files, for the backtest and tests.

Decoding goes through the data plane's ``primus_lib.data.sources.decode.decode`` (the same
code the executors run); a batch window is the left join of its sources on the join keys
with the spec's fill values. ``TableStreamReader`` replays a sample table as a bounded
stream with a single partition, ``GrowingReplay`` a stream the backtest releases hour by
hour; both implement the StreamReader contract.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson

from primus_lib.data.sources.decode import decode
from primus_lib.data.stream import Position, StreamReader
from primus_lib.evaluation.sources import read_batch
from primus_lib.spec.dataset import StreamSpec
from primus_lib.spec.job import PrimusJob


def batch_window(job: PrimusJob, stream: StreamSpec, when: datetime) -> pa.Table:
    """The joined, decoded samples of one batch window: what ``primus eval`` reads (any file source)."""
    return read_batch(job, stream, [when])[0]


def stream_file(job: PrimusJob, stream: StreamSpec, path: Path) -> pa.Table:
    """A JSONL replay of the stream (e.g. datagen's stream/events.jsonl), decoded."""
    raw = pajson.read_json(str(path))
    return decode(job, stream, stream.sources[0], raw, str(path))


class TableStreamReader(StreamReader):
    """A bounded stream over an in-memory sample table (one partition named ``name``)."""

    def __init__(self, table: pa.Table, name: str = "replay"):
        self.table = table
        self.name = name
        self.offset = 0
        self.committed: dict[str, int] = {}

    def poll(self, max_rows: int, timeout: float) -> pa.RecordBatch | None:
        if self.offset >= self.table.num_rows:
            return None
        part = self.table.slice(self.offset, max_rows).combine_chunks()
        self.offset += part.num_rows
        return part.to_batches()[0] if part.num_rows else None

    def position(self) -> dict[str, int]:
        return {self.name: self.offset}

    def seek(self, position: Position) -> None:
        self.offset = int(position.get(self.name, 0))

    def commit(self, position: Position) -> None:
        self.committed = dict(position)

    def end_of_data(self) -> bool:
        return self.offset >= self.table.num_rows


class GrowingReplay(StreamReader):
    """A stream the backtest releases hour by hour: ``extend`` appends rows, ``finish`` ends it.

    Until finished it is a live stream at its edge (an empty poll = caught up), as a Kafka topic
    whose producer has not written the next hour yet.
    """

    def __init__(self, name: str = "replay"):
        self.name = name
        self.chunks: list[pa.Table] = []
        self.chunk = 0  # chunk being read
        self.within = 0  # rows of it already read
        self.offset = 0  # rows read in total (the position)
        self.finished = False

    def extend(self, table: pa.Table) -> None:
        if table.num_rows:
            self.chunks.append(table)

    def finish(self) -> None:
        self.finished = True

    def poll(self, max_rows: int, timeout: float) -> pa.RecordBatch | None:
        while self.chunk < len(self.chunks) and self.within >= self.chunks[self.chunk].num_rows:
            self.chunk, self.within = self.chunk + 1, 0
        if self.chunk >= len(self.chunks):
            return None
        part = self.chunks[self.chunk].slice(self.within, max_rows).combine_chunks()
        self.within += part.num_rows
        self.offset += part.num_rows
        return part.to_batches()[0]

    def position(self) -> dict[str, int]:
        return {self.name: self.offset}

    def seek(self, position: Position) -> None:
        """Only the start or the current position (the backtest never resumes)."""
        if int(position.get(self.name, 0)) != self.offset:
            raise ValueError("GrowingReplay seeks only to its current position")

    def end_of_data(self) -> bool:
        return self.finished and self.poll_left() == 0

    def poll_left(self) -> int:
        return sum(c.num_rows for c in self.chunks[self.chunk :]) - self.within
