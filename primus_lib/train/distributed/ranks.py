"""Which part of the data each rank of a data-parallel trainer reads.

- Batch windows: shard ``i`` of every window goes to rank ``i % world`` (``owns_shard``);
  a rank with no shard of a window finishes it with zero rows.
- Kafka sources: topic-partition ``p`` goes to rank ``p % world``.
- File replays (one partition): row ``k`` of the replay goes to rank ``k % world``
  (``RowShareReader``), so every rank sees the same event time and each row once.

Each rank checkpoints its own cursors; the union over ranks is every sample exactly once.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from primus_lib.data.stream import Position, StreamReader
from primus_lib.spec.job import PrimusJob


def owns_shard(index: int, rank: int, size: int) -> bool:
    return index % size == rank


class RowShareReader(StreamReader):
    """Every ``size``-th row (offset ``rank``) of a single-partition reader.

    The position is the inner reader's (rows read, including other ranks' rows skipped), so
    seeking restores this rank's share exactly.
    """

    def __init__(self, inner: StreamReader, rank: int, size: int):
        self.inner = inner
        self.rank = rank
        self.size = size

    def poll(self, max_rows: int, timeout: float) -> pa.RecordBatch | None:
        while True:
            before = self.inner.position()
            if len(before) > 1:
                raise ValueError(f"RowShareReader needs a single-partition reader, got partitions {sorted(before)}")
            start = next(iter(before.values()), 0)
            batch = self.inner.poll(max_rows * self.size, timeout)
            if batch is None or batch.num_rows == 0:
                return None
            index = np.arange(start, start + batch.num_rows)
            keep = np.nonzero(index % self.size == self.rank)[0]
            if keep.size:
                return batch.take(pa.array(keep))

    def position(self) -> dict[str, int]:
        return self.inner.position()

    def seek(self, position: Position) -> None:
        self.inner.seek(position)

    def commit(self, position: Position) -> None:
        self.inner.commit(position)

    def end_of_data(self) -> bool:
        return self.inner.end_of_data()

    def close(self) -> None:
        self.inner.close()


def open_rank_stream_readers(job: PrimusJob, rank: int, size: int) -> dict[str, list[StreamReader]]:
    """This rank's stream readers: its Kafka partitions, its share of each file replay."""
    from primus_lib.data.sources import open_partitions, open_stream

    readers: dict[str, list[StreamReader]] = {}
    for stream in job.stream_streams:
        mine: list[StreamReader] = []
        for source in stream.sources:
            if source.kafka is None:
                mine.append(RowShareReader(open_stream(job, stream, source), rank, size))
                continue
            for key, reader in open_partitions(job, stream, source).items():
                if owns_shard(int(key.rpartition("/")[2]), rank, size):
                    mine.append(reader)
                else:
                    reader.close()
        readers[stream.name] = mine
    return readers
