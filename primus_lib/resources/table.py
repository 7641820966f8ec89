"""The local backend's on-disk process table: how any process finds and reattaches to a job.

Files under ``JobPaths(...).root / "resources"``:
    job.json         the job the supervisor runs (PrimusJob as JSON)
    desired.json     what callers want: replicas / cpu / memory per role, and a stop flag
    table.json       what the supervisor has: phase, workers (PID, create time, state, restarts)
    supervisor.json  the supervisor's PID and create time (to tell it from a reused PID)
    lock             fcntl lock held while a caller submits or edits desired.json
    logs/            one log per worker
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from primus_lib.paths import JobPaths
from primus_lib.spec.job import PrimusJob


def resources_dir(job: PrimusJob) -> Path:
    return JobPaths.for_job(job).root / "resources"


def write_json(path: Path, data: Any) -> None:
    """Write atomically: readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def identity(pid: int) -> dict[str, float]:
    return {"pid": pid, "create_time": psutil.Process(pid).create_time()}


def alive(entry: dict | None) -> bool:
    """True when the process recorded in ``entry`` (pid + create_time) still runs (not a zombie)."""
    if not entry or not entry.get("pid"):
        return False
    try:
        proc = psutil.Process(int(entry["pid"]))
        if abs(proc.create_time() - float(entry.get("create_time", 0))) > 0.01:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
