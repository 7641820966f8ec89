"""What ``primus eval`` reads: exactly the sources the spec names, as the data plane decodes them.

The batch stream's sources (any file source: local, S3, HDFS/WebHDFS; parquet, csv, jsonl;
partition templates) are listed with the DTGG's lister and read per file with the data
plane's ``read_task`` (``decode``: renames, hashing, timestamps to epoch ms); a window is the
join of its sources. The stream's source is its Kafka topic from the earliest offsets up to
the high watermarks seen when the read starts (a private consumer group that commits
nothing), or its file replay (``ReplayStreamReader``) over the range. Input eval cannot use
raises ``EvalInputError``, one line naming the file, partition, topic or column.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from primus_lib.data.dtgg.listing import FusedLister
from primus_lib.data.schema import job_keys, sample_schema
from primus_lib.data.sources.deadletter import DeadLetters
from primus_lib.data.sources.decode import DecodeError
from primus_lib.data.sources.files import read_task
from primus_lib.data.sources.quality import WindowDataError, clean_window
from primus_lib.data.sources.templates import has_placeholders, partition
from primus_lib.data.task import DataTask
from primus_lib.filesystems import resolve
from primus_lib.paths import window_id
from primus_lib.spec.dataset import KafkaSpec, SourceSpec, StreamSpec
from primus_lib.spec.job import PrimusJob

KAFKA_IDLE_S = 30.0  # a topic read that makes no progress this long is an error


class EvalInputError(ValueError):
    """Input eval cannot use; the message is one line naming the file, source or field."""


def eval_streams(job: PrimusJob) -> tuple[StreamSpec, StreamSpec]:
    """The batch and the stream stream eval replays (it scores each window on the stream)."""
    if not job.batch_streams or not job.stream_streams:
        kinds = ", ".join(f"{s.name} ({s.kind})" for s in job.spec.dataset.streams)
        raise EvalInputError(
            f"job {job.name!r}: primus eval needs a batch and a stream stream in spec.dataset.streams "
            f"(it scores every window on the stream), found {kinds}"
        )
    return job.batch_streams[0], job.stream_streams[0]


def read_batch(job: PrimusJob, stream: StreamSpec, hours: list[datetime]) -> list[pa.Table]:
    """Every window of a batch stream: its sources' partitions, decoded and joined."""
    files = {source.name: _partition_files(job, stream, source, hours) for source in stream.sources}
    windows: list[pa.Table] = []
    dropped: dict[str, int] = {}
    for h in hours:
        joined = _join(job, stream, [_read_files(job, files[s.name][h]) for s in stream.sources], h)
        try:  # the data plane's row checks (data/sources/quality.py), so eval trains on what it would
            table, counts = clean_window(job, stream.name, joined, h)
        except WindowDataError as exc:
            raise EvalInputError(str(exc)) from None
        for reason, n in counts.get("dropped", {}).items():
            dropped[reason] = dropped.get(reason, 0) + n
        windows.append(table.sort_by(job.spec.features.timestamp))
    if dropped:
        detail = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(dropped.items()))
        print(f"primus eval: stream {stream.name!r}: dropped rows ({detail})", file=sys.stderr)
    return windows


def _partition_files(job: PrimusJob, stream: StreamSpec, source: SourceSpec, hours: list[datetime]) -> dict:
    """Hour -> the data tasks (whole files) of the source's partition; None outside its start/end."""
    name = f"source {source.name!r} of stream {stream.name!r}"
    if source.uri is None:
        raise EvalInputError(f"{name}: a batch source needs a uri")
    location = resolve(source.uri, _credentials(source, name))
    window = job.spec.timer.window_size
    parts = {
        h: partition(location.path, h, source.file_pattern, source.success_marker)
        for h in hours
        if (source.start is None or h + window > source.start) and (source.end is None or h < source.end)
    }
    try:
        listing = FusedLister(threads=1).list(location.fs, {p.directory for p in parts.values()})
    except (OSError, pa.ArrowException) as exc:
        raise EvalInputError(f"{source.uri}: cannot list ({name}): {_line(exc)}") from None
    out: dict[datetime, list[DataTask] | None] = {}
    for h in hours:
        part = parts.get(h)
        if part is None:
            out[h] = None
            continue
        entries, where = listing.files(part.directory), location.uri(part.directory)
        if entries is None:
            raise EvalInputError(f"{where}: partition missing ({name}, window {window_id(h)})")
        if part.marker and not any(e.name == part.marker for e in entries):
            raise EvalInputError(f"{where}: partition not complete, {part.marker} missing ({name})")
        out[h] = [
            DataTask(
                location.uri(part.directory + e.name),
                stream.name,
                source.name,
                window_id(h),
                location.uri(part.directory + e.name),
                part.directory + e.name,
                source.format,
                e.size,
            )
            for e in entries
            if part.matches(e.name)
        ]
    return out


def _read_files(job: PrimusJob, tasks: list[DataTask] | None) -> pa.Table | None:
    tables = []
    for task in tasks or []:
        try:
            tables.append(read_task(job, task))
        except (DecodeError, OSError, pa.ArrowException) as exc:
            raise EvalInputError(_named(task.uri, exc)) from None
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def _join(job: PrimusJob, stream: StreamSpec, tables: list[pa.Table | None], when: datetime) -> pa.Table:
    """The left-to-right join of the sources' tables on the stream's keys, in the sample schema."""
    schema = sample_schema(job.spec.features, job_keys(job))
    how = stream.join.how if stream.join else "left"
    if tables[0] is None and how != "outer":
        return schema.empty_table()
    joined: pa.Table | None = None
    for table in tables:
        if table is None:
            continue
        if joined is None:
            joined = table
            continue
        keys = stream.join.keys if stream.join else job_keys(job)
        kind = {"left": "left outer", "inner": "inner", "outer": "full outer"}[how]
        joined = joined.join(table, keys=keys, join_type=kind, use_threads=False)
    if joined is None:
        return schema.empty_table()
    fill = stream.join.fill if stream.join else {}
    columns = []
    for field in schema:
        if field.name not in joined.column_names:
            raise EvalInputError(f"stream {stream.name!r}: window {window_id(when)} has no column {field.name!r}")
        column = joined.column(field.name)
        try:
            if field.name in fill:
                column = pc.fill_null(column, pa.scalar(fill[field.name]).cast(field.type))
            columns.append(column.cast(field.type))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise EvalInputError(f"stream {stream.name!r}: column {field.name!r}: {_line(exc)}") from None
    return pa.Table.from_arrays(columns, schema=schema).sort_by(job.spec.features.timestamp)


def read_stream(job: PrimusJob, stream: StreamSpec, start: datetime, end: datetime) -> pa.Table:
    """The stream's rows: a Kafka topic from its earliest offsets to the end (bounded when the
    read starts), or a file replay (parquet, csv, jsonl) over ``[start, end)``."""
    tables = []
    for source in stream.sources:
        name = f"source {source.name!r} of stream {stream.name!r}"
        letters = _Kept()
        try:
            if source.kafka is not None:
                tables.append(_read_kafka(job, stream, source, source.kafka, letters))
            else:
                tables.append(_read_replay(job, stream, source, start, end, letters))
        except (DecodeError, OSError, pa.ArrowException) as exc:
            raise EvalInputError(f"{name}: {_line(exc)}") from None
        if letters.count:
            print(
                f"primus eval: {name}: skipped {letters.count} malformed records (first: {letters.first})",
                file=sys.stderr,
            )
    return pa.concat_tables(tables).combine_chunks()


def _read_replay(job, stream: StreamSpec, source: SourceSpec, start, end, letters: DeadLetters) -> pa.Table:
    from primus_lib.data.sources.replay import ReplayStreamReader

    if source.uri is None:
        raise EvalInputError(f"source {source.name!r} of stream {stream.name!r}: neither kafka nor uri")
    location = resolve(source.uri, _credentials(source, f"source {source.name!r} of stream {stream.name!r}"))
    if not has_placeholders(location.path) and location.fs.get_file_info(location.path).type == pafs.FileType.NotFound:
        raise EvalInputError(f"{source.uri}: stream file missing (source {source.name!r} of stream {stream.name!r})")
    reader = ReplayStreamReader(job, stream, source, start=start, end=end, dead_letters=letters)
    try:
        return _drain(job, reader, lambda: False)
    finally:
        reader.close()


def _read_kafka(job, stream: StreamSpec, source: SourceSpec, spec: KafkaSpec, letters: DeadLetters) -> pa.Table:
    """The topic from its earliest offsets up to the high watermarks seen when the read starts
    (a private group that commits nothing; malformed messages are counted, not dead-lettered)."""
    from confluent_kafka import KafkaException

    from primus_lib.data.sources.kafka import KafkaLoginRefused, KafkaStreamReader

    options = {"log_level": "0", **spec.options}  # errors come back as one line, not librdkafka's log
    kafka = spec.model_copy(update={"startup": "earliest", "options": options})
    source = source.model_copy(update={"kafka": kafka})
    topic = f"kafka topic {kafka.topic!r} at {kafka.bootstrap_servers}"
    try:
        reader = KafkaStreamReader(
            job, stream, source, group_id=f"primus-eval-{os.getpid()}-{time.time_ns()}", dead_letters=letters
        )
    except KafkaLoginRefused as exc:  # its message names the topic, the broker and the connection
        raise EvalInputError(str(exc)) from None
    except KafkaException as exc:
        raise EvalInputError(f"{topic}: {_line(exc)}") from None
    try:
        target = {k: reader.position()[k] + n for k, n in reader.lag().items()}
        seen, since = dict(reader.position()), time.monotonic()

        def done() -> bool:
            nonlocal seen, since
            at = reader.position()
            if all(at.get(k, 0) >= v for k, v in target.items()):
                return True
            if at != seen:
                seen, since = dict(at), time.monotonic()
            elif time.monotonic() - since > KAFKA_IDLE_S:
                raise EvalInputError(f"{topic}: no progress for {KAFKA_IDLE_S:.0f}s at {at}, end {target}")
            return False

        return _drain(job, reader, done, timeout=1.0)
    except KafkaException as exc:
        raise EvalInputError(f"{topic}: {_line(exc)}") from None
    finally:
        reader.close()


def _drain(job: PrimusJob, reader, done, timeout: float = 0.0) -> pa.Table:
    """Poll ``reader`` until it ends (a replay) or ``done()`` (a topic read up to its end)."""
    batches = []
    while not done():
        batch = reader.poll(65536, timeout)
        if batch is not None:
            batches.append(batch)
        elif reader.end_of_data():
            break
    schema = sample_schema(job.spec.features, job_keys(job))
    return pa.Table.from_batches(batches, schema) if batches else schema.empty_table()


class _Kept(DeadLetters):
    """Malformed records counted, the first one's origin and reason kept for the warning."""

    def __init__(self) -> None:
        super().__init__()
        self.first = ""

    def _send(self, value: bytes, reason: str, origin: str) -> None:
        self.first = self.first or f"{origin}: {reason}"


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _named(uri: str, exc: BaseException) -> str:
    message = _line(exc)
    return message if uri in message else f"{uri}: {message}"


def _credentials(source: SourceSpec, where: str):
    """The source's storage credentials (its ``connection_id``, else the default connection of its kind)."""
    from primus_lib.credentials import current

    return current().storage(source.connection_id, where, source.uri or "")
