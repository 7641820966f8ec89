"""The DTGG operators besides the Timer: DataSource, Joiner and Sink.

- DataSourceOp: for one window, turns the source's listed partition into data tasks (a file
  per task, or byte-range splits of a large parquet file) and says whether it is ready.
- JoinerOp: collects the tasks of all sources of a window; once every source has reported,
  the window is fully planned (a WindowPlan).
- SinkOp: pushes a planned window into the task queue (the ledger), strictly after the
  previous window's Sink, which keeps global time order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from primus_lib.credentials import current
from primus_lib.data.dtgg.listing import FileEntry, Listing
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.sources.templates import Partition, partition
from primus_lib.data.task import DataTask
from primus_lib.filesystems import Location, StorageCredentials, resolve
from primus_lib.paths import window_id
from primus_lib.spec.dataset import SourceSpec, StreamSpec
from primus_lib.spec.job import PrimusJob


class PartitionNotReady(RuntimeError):
    """A window's partition is missing, incomplete (no success marker) or not due yet."""


@dataclass(frozen=True)
class SourceResult:
    source: str
    tasks: list[DataTask]
    missing: str | None  # why the source is not ready; None when it is


class DataSourceOp:
    """Plans one batch source: where each window's partition lies and which tasks it yields."""

    def __init__(
        self, job: PrimusJob, stream: StreamSpec, source: SourceSpec, credentials: StorageCredentials | None = None
    ):
        if source.uri is None:
            raise ValueError(
                f"source {source.name!r} of stream {stream.name!r} has no uri (a batch source reads files)"
            )
        self.job, self.stream, self.source = job, stream, source
        if credentials is None:  # the caller resolved none: the process's connections (credentials.current)
            where = f"spec.dataset.streams[{stream.name}].sources[{source.name}].connection_id"
            credentials = current().storage(source.connection_id, where, source.uri)
        self.location: Location = resolve(source.uri, credentials)
        self.size: timedelta = job.spec.timer.window_size

    def partition(self, start: datetime) -> Partition:
        return partition(self.location.path, start, self.source.file_pattern, self.source.success_marker)

    def active(self, start: datetime) -> bool:
        """Whether the source has data for this window at all (its own start/end)."""
        s, e = self.source.start, self.source.end
        return (s is None or start + self.size > s) and (e is None or start < e)

    def run(self, start: datetime, listing: Listing, now: datetime) -> SourceResult:
        if not self.active(start):
            return SourceResult(self.source.name, [], None)
        part = self.partition(start)
        entries = listing.files(part.directory)
        missing = self.missing(start, part, entries, now)
        if missing is not None:
            return SourceResult(self.source.name, [], missing)
        files = [e for e in entries or [] if part.matches(e.name)]
        return SourceResult(self.source.name, self.tasks(start, part, files), None)

    def missing(self, start: datetime, part: Partition, entries: list[FileEntry] | None, now: datetime) -> str | None:
        where = self.location.uri(part.directory)
        label = f"source {self.source.name!r} window {window_id(start)}"
        if part.marker is not None:
            if entries is None or not any(e.name == part.marker for e in entries):
                state = "directory not found" if entries is None else f"success marker {part.marker!r} not found"
                return f"{label}: partition {where} incomplete or late ({state})"
            return None
        due = start + self.size + self.stream.lag
        if now < due:
            return f"{label}: partition {where} not due until {due:%Y-%m-%dT%H:%M:%SZ} (window end + lag {self.stream.lag})"
        if entries is None:
            return f"{label}: partition {where} missing (directory not found)"
        return None

    def tasks(self, start: datetime, part: Partition, files: list[FileEntry]) -> list[DataTask]:
        wid = window_id(start)
        split = self.source.split_bytes if self.source.format == "parquet" else None
        stream, source, fmt = self.stream.name, self.source.name, self.source.format
        prefix = f"{stream}.{wid}.{source}."
        base_uri = self.location.uri(part.directory)  # + name: the same as uri(directory + name)
        out: list[DataTask] = []
        for entry in files:
            name, size = entry
            path = part.directory + name
            uri = base_uri + name
            chunk = split if split and size > split else None  # None (the common case): one task per file, read whole
            n = -(-size // chunk) if chunk else 1
            for k in range(n):
                out.append(
                    DataTask.fast(
                        id=f"{prefix}{len(out):05d}",
                        stream=stream,
                        source=source,
                        window=wid,
                        uri=uri,
                        path=path,
                        format=fmt,
                        size=size,
                        offset=k * chunk if chunk else 0,
                        length=chunk,
                        split=k,
                        splits=n,
                    )
                )
        return out


@dataclass
class WindowPlan:
    """A window once every source reported: its tasks (sources in spec order) or what is missing."""

    stream: str
    start: datetime
    tasks: list[DataTask] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    cached: bool = False

    @property
    def window(self) -> str:
        return window_id(self.start)

    @property
    def ready(self) -> bool:
        return not self.missing

    def by_source(self, source: str) -> list[DataTask]:
        return [t for t in self.tasks if t.source == source]


class JoinerOp:
    """The barrier of one window: complete when every source of the stream has reported."""

    def __init__(self, stream: StreamSpec):
        self.sources = [s.name for s in stream.sources]
        self.stream = stream.name

    def join(self, start: datetime, results: list[SourceResult]) -> WindowPlan:
        by_name = {r.source: r for r in results}
        absent = [name for name in self.sources if name not in by_name]
        if absent:
            raise RuntimeError(f"window {window_id(start)}: sources {absent} never reported")
        plan = WindowPlan(self.stream, start)
        for name in self.sources:
            plan.tasks.extend(by_name[name].tasks)
            if by_name[name].missing:
                plan.missing.append(by_name[name].missing)  # type: ignore[arg-type]
        return plan


class SinkOp:
    """Pushes planned windows into the ledger in strict time order (each after its predecessor)."""

    def __init__(self, ledger: TaskLedger | None):
        self.ledger = ledger
        self.last: datetime | None = None

    def push(self, plan: WindowPlan) -> None:
        self.push_all([plan])

    def push_all(self, plans: list[WindowPlan]) -> None:
        """Sink consecutive windows (each after the previous one) in one ledger transaction."""
        for plan in plans:
            if self.last is not None and plan.start <= self.last:
                raise RuntimeError(f"sink order: window {plan.window} after {window_id(self.last)}")
            if not plan.ready:
                raise PartitionNotReady("; ".join(plan.missing))
            self.last = plan.start
        fresh = [(p.window, p.tasks) for p in plans if not p.cached]
        if self.ledger is not None and fresh:
            self.ledger.add_windows(plans[0].stream, fresh)
