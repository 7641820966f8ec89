"""Batch file sources: read one data task (a file or a byte-range split of it) as an Arrow table.

Formats: parquet (split by byte range: a split reads the row groups whose first byte lies in
its range, so every row group belongs to exactly one split and the planner never opens files),
csv and jsonl (whole files only). Only the columns the sample needs are read.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq

from primus_lib.credentials import StorageCredentials, current
from primus_lib.data.sources.decode import DecodeError, column_map, decode
from primus_lib.data.task import DataTask
from primus_lib.filesystems import resolve
from primus_lib.spec.dataset import SourceSpec, StreamSpec
from primus_lib.spec.job import PrimusJob


def find_source(job: PrimusJob, stream_name: str, source_name: str) -> tuple[StreamSpec, SourceSpec]:
    stream = job.stream(stream_name)
    for source in stream.sources:
        if source.name == source_name:
            return stream, source
    raise KeyError(f"stream {stream_name!r} of job {job.name!r} has no source {source_name!r}")


def read_task(job: PrimusJob, task: DataTask) -> pa.Table:
    """Read and decode one data task into the sample columns its source has."""
    stream, source = find_source(job, task.stream, task.source)
    wanted = set(column_map(job, source).values())
    where = f"spec.dataset.streams[{stream.name}].sources[{source.name}].connection_id"
    raw = read_raw(task, wanted, current().storage(source.connection_id, where, task.uri))
    return decode(job, stream, source, raw, task.uri)


def read_raw(task: DataTask, wanted: set[str] | None = None, credentials: StorageCredentials | None = None) -> pa.Table:
    location = resolve(task.uri, credentials)
    try:
        if task.format == "parquet":
            return _read_parquet(location.fs, location.path, task, wanted)
        with open_whole(location.fs, location.path) as handle:
            if task.format == "csv":
                import pyarrow.csv as pacsv

                options = pacsv.ConvertOptions(include_columns=None)
                table = pacsv.read_csv(handle, convert_options=options)
            elif task.format in ("jsonl", "json"):
                import pyarrow.json as pajson

                table = pajson.read_json(handle)
            else:
                raise DecodeError(f"{task.uri}: unsupported format {task.format!r}")
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise FileNotFoundError(f"{task.uri}: data file vanished after planning ({exc})") from None
        raise DecodeError(f"{task.uri}: cannot read as {task.format}: {exc}") from None
    return table.select([c for c in table.column_names if wanted is None or c in wanted])


def open_whole(fs, path: str) -> pa.NativeFile:
    """A file to read through (a csv, a jsonl): streamed from the local disk; a remote one fetched in
    one GET (on S3 an input stream fetches ranges of ~256 KB, a random-access file one GET a read)."""
    if fs.type_name == "local":
        return fs.open_input_stream(path)
    with fs.open_input_file(path) as handle:
        return pa.BufferReader(handle.read())


def _read_parquet(fs, path: str, task: DataTask, wanted: set[str] | None) -> pa.Table:
    """The column chunks come in one request where they are adjacent (pyarrow's ``pre_buffer``, on by
    default): on S3 a 6 MB file of seven columns in 3 requests, not 9 (tests/data/test_remote_requests.py)."""
    with fs.open_input_file(path) as handle:
        reader = pq.ParquetFile(handle)
        names = reader.schema_arrow.names
        columns = [c for c in names if wanted is None or c in wanted]
        if task.length is None:
            groups = list(range(reader.num_row_groups))
        else:
            groups = [
                i
                for i in range(reader.num_row_groups)
                if task.offset <= _group_start(reader.metadata.row_group(i)) < task.offset + task.length
            ]
        if not groups:
            return reader.schema_arrow.empty_table().select(columns)
        schema = pa.schema([reader.schema_arrow.field(c) for c in columns])
        if (
            columns
            and fs.type_name == "local"
            and all(_plain(f.type) for f in schema)
            and _polars_pays(task)
            and groups == list(range(groups[0], groups[-1] + 1))
        ):
            rows = [reader.metadata.row_group(i).num_rows for i in range(groups[-1] + 1)]
            table = _read_polars(path, schema, sum(rows[: groups[0]]), sum(rows[groups[0] :]))
            if table is not None:
                return table
        threads = pa.cpu_count() > 1  # the allotment's threads
        return reader.read_row_groups(groups, columns=columns, use_threads=threads)


POLARS_MIN_BYTES = 128 << 20
"""A task this large is read by Polars even where Polars is not imported yet: its reader saves
about 1 ms of CPU per MB of parquet against pyarrow's (bench/executor.py's files), its import
costs ~160 ms, and a mapped data task is a process of its own that reads one task."""


def _polars_pays(task: DataTask) -> bool:
    """Whether Polars' reader is worth it for ``task``: Polars is already imported (a long-lived
    executor, the CLI), or the task is big enough to pay for the import."""
    return "polars" in sys.modules or (task.length or task.size or 0) >= POLARS_MIN_BYTES


def _plain(kind: pa.DataType) -> bool:
    """Types Polars reads into exactly what pyarrow would (after a cast to the file's Arrow schema)."""
    return (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
    ) and not pa.types.is_float16(kind)


def _read_polars(path: str, schema: pa.Schema, offset: int, rows: int) -> pa.Table | None:
    """A local file's rows ``[offset, offset + rows)`` through Polars' parquet reader: half the CPU
    of pyarrow's on the same columns (measured by bench/executor.py), cast back to the file's Arrow
    types so decoding sees the same table either way. On the calling thread: an executor's task
    runners (one per allotted thread) are its parallelism, and Polars' spinning pool on top of
    them cost CPU. None when Polars cannot read it: pyarrow then reads it (and names what is
    wrong with the file)."""
    try:
        import polars as pl
    except ImportError:  # an install without Polars (it is in requirements/lock.txt): pyarrow reads
        return None
    try:
        frame = (
            pl.scan_parquet(path, parallel="none", hive_partitioning=False, glob=False)
            .select(schema.names)
            .slice(offset, rows)
            .collect()
        )
        table = frame.to_arrow().cast(schema)
    except (pl.exceptions.PolarsError, pa.ArrowException, OSError):
        return None
    return table if table.num_rows == rows else None


def _group_start(group: pq.RowGroupMetaData) -> int:
    column = group.column(0)
    starts = [column.data_page_offset]
    if column.has_dictionary_page and column.dictionary_page_offset:
        starts.append(column.dictionary_page_offset)
    return min(starts)
