"""Stream replay of batch files in event-time order, for backtests of the online path.

The source's files (its URI template over the timer's windows, or one fixed path) are read a
window at a time, decoded, and served sorted by timestamp (stable, so ties keep file order).
The position is the number of samples served so far; ``seek`` skips that many. JSONL lines
that cannot be decoded are dead-lettered to a file under the job directory and counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_lib.credentials import current
from primus_lib.data.dtgg import timer
from primus_lib.data.dtgg.listing import FusedLister
from primus_lib.data.sources.deadletter import DeadLetters, FileDeadLetters
from primus_lib.data.sources.decode import column_map, conform, decode
from primus_lib.data.sources.files import open_whole, read_raw
from primus_lib.data.sources.messages import decode_messages
from primus_lib.data.sources.templates import has_placeholders, partition
from primus_lib.data.stream import Position, StreamReader
from primus_lib.data.task import DataTask
from primus_lib.filesystems import resolve
from primus_lib.paths import JobPaths
from primus_lib.spec.dataset import SourceSpec, StreamSpec
from primus_lib.spec.job import PrimusJob


class ReplayStreamReader(StreamReader):
    def __init__(
        self,
        job: PrimusJob,
        stream: StreamSpec,
        source: SourceSpec,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        dead_letters: DeadLetters | None = None,
    ):
        if source.uri is None:
            raise ValueError(f"source {source.name!r} of stream {stream.name!r}: a replay needs a uri")
        self.job, self.stream, self.source = job, stream, source
        self.key = f"replay/{source.name}"
        where = f"spec.dataset.streams[{stream.name}].sources[{source.name}].connection_id"
        self.location = resolve(source.uri, current().storage(source.connection_id, where, source.uri))
        self.dead_letters = dead_letters or FileDeadLetters(
            JobPaths.for_job(job).root / "dlq" / stream.name / f"{source.name}.jsonl"
        )
        self.malformed = 0
        self._windows = self._window_iter(start, end)
        self._current: pa.Table | None = None
        self._row = 0  # in the current table
        self._served = 0
        self._done = False
        self.last_offsets: tuple[list[str], np.ndarray] = ([], np.empty(0, np.int64))

    def _window_iter(self, start: datetime | None, end: datetime | None) -> Iterator[list[str]]:
        if not has_placeholders(self.location.path):
            yield [self.location.path]
            return
        stop = end or self.job.spec.timer.end or datetime.now(UTC)
        for window in timer.windows(self.job, start, stop):
            part = partition(self.location.path, window, self.source.file_pattern, self.source.success_marker)
            listing = FusedLister(threads=1).list(self.location.fs, {part.directory})
            names = [e.name for e in listing.files(part.directory) or [] if part.matches(e.name)]
            yield [part.directory + n for n in names]

    def _load(self, paths: list[str]) -> pa.Table:
        tables = []
        for path in paths:
            uri = self.location.uri(path)
            if self.source.format in ("jsonl", "json"):
                with open_whole(self.location.fs, path) as handle:
                    lines = [line for line in handle.read().split(b"\n") if line.strip()]
                table, _, bad = decode_messages(self.job, self.stream, self.source, lines, uri)
                for item in bad:
                    self.dead_letters.send(lines[item.index], item.reason, f"{uri}:{item.index + 1}")
                    self.malformed += 1
            else:
                task = DataTask(uri, self.stream.name, self.source.name, "", uri, path, self.source.format, 0)
                table = decode(
                    self.job,
                    self.stream,
                    self.source,
                    read_raw(task, set(column_map(self.job, self.source).values())),
                    uri,
                )
            tables.append(table)
        if not tables:
            return pa.table({})
        table = conform(self.job, pa.concat_tables(tables, promote_options="permissive"))
        ts = self.job.spec.features.timestamp
        if ts in table.column_names and table.num_rows:
            table = table.take(pc.sort_indices(table, sort_keys=[(ts, "ascending")]))
        return table.combine_chunks()

    def poll(self, max_rows: int, timeout: float) -> pa.RecordBatch | None:
        while self._current is None or self._row >= self._current.num_rows:
            paths = next(self._windows, None)
            if paths is None:
                self._done = True
                self.last_offsets = ([], np.empty(0, np.int64))
                return None
            self._current, self._row = self._load(paths), 0
        part = self._current.slice(self._row, max_rows)
        self._row += part.num_rows
        first = self._served
        self._served += part.num_rows
        self.last_offsets = ([self.key] * part.num_rows, np.arange(first, self._served, dtype=np.int64))
        return part.to_batches()[0] if part.num_rows else None

    def position(self) -> dict[str, int]:
        return {self.key: self._served}

    def seek(self, position: Position) -> None:
        target = int(position.get(self.key, 0))
        if target < self._served:
            raise ValueError(
                f"replay {self.source.name}: cannot seek back from {self._served} to {target}; open a new reader"
            )
        while self._served < target:
            if self.poll(target - self._served, 0) is None and self._done:
                raise ValueError(
                    f"replay {self.source.name}: position {target} is past the end ({self._served} samples)"
                )

    def end_of_data(self) -> bool:
        return self._done

    def close(self) -> None:
        self.dead_letters.close()
