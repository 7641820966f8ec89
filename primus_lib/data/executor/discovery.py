"""Where a stream's executors serve: an interface and its implementations.

- ``LocalDiscovery`` (the local backend, one machine): every executor writes
  ``<job root>/resources/executors/<stream>/<index>.json`` (location, pid, partitions, replicas)
  once its Flight server listens, atomically; an entry whose process is gone is not served.
- ``StaticDiscovery``: a fixed list of locations (``$PRIMUS_STREAM_EXECUTORS``, comma
  separated, ``grpc://host:port``), for clusters where a Service name or a registry gives them.

Kubernetes (a headless Service's DNS: ``<statefulset>-<i>.<service>``) and YARN (the registry
or the application report) are not built yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

from primus_lib.paths import JobPaths
from primus_lib.spec.job import PrimusJob

ROLE = "stream_executor"
ENV_LOCATIONS = "PRIMUS_STREAM_EXECUTORS"


def executor_replicas(job: PrimusJob, role: str = ROLE) -> int:
    """How many executors serve each stream: the role's replicas (0 = no executors)."""
    spec = job.spec.resources.roles.get(role)
    return 0 if spec is None else spec.replicas


class ExecutorDiscovery(ABC):
    @abstractmethod
    def locations(self) -> dict[int, str]:
        """Executor index -> Flight location, of the executors serving now."""

    def register(self, index: int, location: str, info: dict) -> None:  # noqa: B027 - optional
        """Announce executor ``index`` (called by the executor once it listens)."""

    def unregister(self, index: int) -> None:  # noqa: B027
        """Withdraw executor ``index`` (a clean stop)."""


class StaticDiscovery(ExecutorDiscovery):
    def __init__(self, locations: list[str]):
        self._locations = {i: loc for i, loc in enumerate(locations)}

    def locations(self) -> dict[int, str]:
        return dict(self._locations)


class LocalDiscovery(ExecutorDiscovery):
    def __init__(self, directory: Path):
        self.directory = directory

    @classmethod
    def for_stream(cls, job: PrimusJob, stream: str) -> LocalDiscovery:
        return cls(JobPaths.for_job(job).root / "resources" / "executors" / stream)

    def _path(self, index: int) -> Path:
        return self.directory / f"{index}.json"

    def register(self, index: int, location: str, info: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        body = {**info, "index": index, "location": location, "pid": os.getpid()}
        fd, tmp = tempfile.mkstemp(prefix=f".{index}.", dir=self.directory)
        with os.fdopen(fd, "w") as handle:
            json.dump(body, handle)
        os.replace(tmp, self._path(index))

    def unregister(self, index: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(index).unlink()

    def entries(self) -> dict[int, dict]:
        out = {}
        for path in sorted(self.directory.glob("*.json")):
            try:
                entry = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # replaced meanwhile
            if _alive(int(entry.get("pid", 0))):
                out[int(entry["index"])] = entry
        return out

    def locations(self) -> dict[int, str]:
        return {i: e["location"] for i, e in self.entries().items()}


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child not yet reaped is a zombie: gone for our purposes
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def discovery_for(job: PrimusJob, stream: str) -> ExecutorDiscovery:
    """$PRIMUS_STREAM_EXECUTORS when set, else the backend's own way (local: the ports files)."""
    raw = os.environ.get(ENV_LOCATIONS, "").strip()
    if raw:
        return StaticDiscovery([part.strip() for part in raw.split(",") if part.strip()])
    backend = job.spec.resources.backend
    if backend != "local":
        raise NotImplementedError(
            f"stream executor discovery on the {backend} backend is not built yet: set ${ENV_LOCATIONS}"
        )
    return LocalDiscovery.for_stream(job, stream)
