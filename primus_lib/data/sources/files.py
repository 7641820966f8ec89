"""Batch file sources: read one data task (a file or a byte-range split of it) as an Arrow table.

Formats: parquet (split by byte range: a split reads the row groups whose first byte lies in
its range, so every row group belongs to exactly one split and the planner never opens files),
csv and jsonl (whole files only). Only the columns the sample needs are read.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

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
    raw = read_raw(task, wanted)
    return decode(job, stream, source, raw, task.uri)


def read_raw(task: DataTask, wanted: set[str] | None = None) -> pa.Table:
    location = resolve(task.uri)
    try:
        if task.format == "parquet":
            return _read_parquet(location.fs, location.path, task, wanted)
        with location.fs.open_input_stream(location.path) as handle:
            if task.format == "csv":
                options = pacsv.ConvertOptions(include_columns=None)
                table = pacsv.read_csv(handle, convert_options=options)
            elif task.format in ("jsonl", "json"):
                table = pajson.read_json(handle)
            else:
                raise DecodeError(f"{task.uri}: unsupported format {task.format!r}")
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise FileNotFoundError(f"{task.uri}: data file vanished after planning ({exc})") from None
        raise DecodeError(f"{task.uri}: cannot read as {task.format}: {exc}") from None
    return table.select([c for c in table.column_names if wanted is None or c in wanted])


def _read_parquet(fs, path: str, task: DataTask, wanted: set[str] | None) -> pa.Table:
    with fs.open_input_file(path) as handle:
        reader = pq.ParquetFile(handle)
        names = reader.schema_arrow.names
        columns = [c for c in names if wanted is None or c in wanted]
        if task.length is None:
            groups = list(range(reader.num_row_groups))
        else:
            groups = [i for i in range(reader.num_row_groups)
                      if task.offset <= _group_start(reader.metadata.row_group(i)) < task.offset + task.length]  # fmt: skip
        if not groups:
            return reader.schema_arrow.empty_table().select(columns)
        return reader.read_row_groups(groups, columns=columns, use_threads=False)


def _group_start(group: pq.RowGroupMetaData) -> int:
    column = group.column(0)
    starts = [column.data_page_offset]
    if column.has_dictionary_page and column.dictionary_page_offset:
        starts.append(column.dictionary_page_offset)
    return min(starts)
