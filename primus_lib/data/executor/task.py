"""Run one batch data task: read, decode, and stage it as an Arrow IPC file (atomic, idempotent).

The staged file is ``<job state>/staging/<stream>/<window-id>/<source>/<task-id>.arrow``. It is
put atomically (``StorageLocation.writer(atomic=True)``), so a killed executor leaves no half file
where the join looks; running a task again finds the staged file and returns it unchanged. Staged
files are intermediates and are not fsynced (like a shuffle file): after a host crash a torn one
fails the IPC footer check (in ``read_staged``, or when the task runs again) and is removed so the
task can be run again. The committed window (shards + manifest) is durable.
"""

from __future__ import annotations

import sys
import time
import zlib
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import pyarrow as pa

from primus_lib.data.executor.metrics import TaskMetrics
from primus_lib.data.sources.files import read_task
from primus_lib.data.task import DataTask
from primus_lib.durable import Crc32, Digesting, write_ipc
from primus_lib.paths import JobPaths
from primus_lib.resources.limits import Limits, enforced
from primus_lib.spec.job import PrimusJob
from primus_lib.storage import StorageLocation, Where, locate

EXECUTOR_ROLE = "data_executor"  # whose allotment (scaling/resources.json, else the spec) a task runs under


@dataclass(frozen=True)
class TaskOutput:
    task_id: str
    path: str
    rows: int
    checksum: str  # "crc32:<hex>" of the staged file (a torn file fails its IPC footer check first)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> TaskOutput:
        raw = dict(raw)
        if "sha256" in raw:  # recorded before the checksum became crc32
            raw["checksum"] = f"sha256:{raw.pop('sha256')}"
        return cls(**raw)


def checksum(data: bytes | pa.Buffer) -> str:
    """The staged file's checksum: crc32, 2-3x cheaper than sha256 (the committed shards keep
    sha256: remote readers verify it); a staged file is an intermediate read once by the join."""
    return f"crc32:{zlib.crc32(data):08x}"


def staging_dir(job: PrimusJob, stream: str, window: str) -> StorageLocation:
    """Where a window's staged task outputs go: next to the committed windows (``JobPaths.state``),
    so a Joiner on another host (another private working directory) finds them."""
    return JobPaths.for_job(job).state / "staging" / stream / window


def staging_path(job: PrimusJob, task: DataTask) -> StorageLocation:
    return staging_dir(job, task.stream, task.window) / task.source / f"{task.id}.arrow"


def execute_task(job: PrimusJob, task: DataTask, *, timings: dict[str, float] | None = None) -> TaskOutput:
    """Decode one data task into its staging file; a task already staged is returned as is.

    The task runs under the data executors' current allotment (``primus_lib.resources.limits``):
    ``ceil(cpu)`` Arrow/OpenMP threads, a memory cap (``MemoryCapExceeded`` past it).
    ``timings``, if given, accumulates the seconds spent reading + decoding and staging."""
    path = staging_path(job, task)
    if path.exists():
        try:
            return _describe(task.id, path)
        except pa.ArrowInvalid:  # torn by a host crash (staged files are not fsynced): stage it again
            path.delete()
    limits = Limits.for_role(job, EXECUTOR_ROLE)  # read at start: the scaler may have resized the role
    with enforced(limits, f"data task {task.id}") if limits else nullcontext():
        began = time.perf_counter()
        allotment = (limits.cpu, limits.memory) if limits else None
        report = TaskMetrics.start(job, task.id, allotment)  # the scaler's inputs (executor/metrics.py)
        measured = time.perf_counter() - began
        began += measured
        table = read_task(job, task).combine_chunks()
        read = time.perf_counter()
        with path.writer(atomic=True, durable=False) as handle:  # not fsynced: an intermediate (see above)
            out = Digesting(handle, Crc32())
            write_ipc(out, table)
        digest = f"crc32:{out.digest.hexdigest()}"  # == checksum(the file's bytes)
        staged = time.perf_counter()
        if report is not None:
            report.finish(table.num_rows)
        if timings is not None:
            timings["read_decode"] = timings.get("read_decode", 0.0) + read - began
            timings["stage"] = timings.get("stage", 0.0) + staged - read
            timings["metrics"] = timings.get("metrics", 0.0) + measured + time.perf_counter() - staged
    return TaskOutput(task.id, str(path), table.num_rows, digest)


class _NoPandas:
    """An import finder that refuses pandas (see ``skip_arrow_pandas_probe``)."""

    def find_spec(self, name: str, path=None, target=None):
        if name == "pandas":
            raise ImportError("pandas is not needed by a data task")
        return None


def skip_arrow_pandas_probe() -> None:
    """For a process that runs one data task and exits (a mapped Airflow task): the first time
    pyarrow builds an array or a scalar from Python values it imports pandas (~0.4 s) to see
    whether they are pandas objects; the data path never hands it any. This lets that one probe
    find no pandas. pandas itself still works in the process: an explicit conversion
    (``to_pandas``, ``from_pandas``) imports it then, and string ids are hashed with pandas'
    ``hash_array``, imported where it is used. A no-op once pandas is imported."""
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)


class StagedOutputCorrupt(RuntimeError):
    """A staged task output cannot be read (torn by a crash); it was removed: run the task again."""


def read_staged(path: Where) -> pa.Table:
    path = locate(path)
    try:
        return pa.ipc.open_file(path.read_buffer()).read_all()
    except pa.ArrowInvalid as exc:
        path.delete()
        raise StagedOutputCorrupt(f"{path}: unreadable staged output ({exc}); removed it, run the task again") from None


def _describe(task_id: str, path: StorageLocation) -> TaskOutput:
    data = path.read_bytes()
    rows = pa.ipc.open_file(pa.BufferReader(data)).read_all().num_rows
    return TaskOutput(task_id, str(path), rows, checksum(data))
