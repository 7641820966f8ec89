"""Where a stream's executors serve: an interface and its implementations.

- ``LocalDiscovery`` (the local backend, one machine): every executor writes
  ``<job root>/resources/executors/<stream>/<index>.json`` (location, pid, partitions, replicas)
  once its Flight server listens, atomically; an entry whose process is gone is not served.
- ``StaticDiscovery``: a fixed list of locations (``$PRIMUS_STREAM_EXECUTORS``, comma
  separated, ``grpc://host:port``), for clusters where a Service name or a registry gives them.

- ``KubernetesDiscovery`` (the kubernetes backend, ``primus_lib.resources.kubernetes.discovery``): the ready addresses of the stream executors'
  headless Service's Endpoints (``<job>-stream-executor``, port ``flight``); the endpoints controller
  lists a pod once it is Ready (its Flight port accepts connections), with its hostname
  ``<statefulset>-<i>``: ``i`` is the executor's index. Registration is the Endpoints themselves.

- ``SharedStateDiscovery`` (the yarn backend, and the local backend with a remote storage root):
  every executor writes ``executors/<stream>/<index>.json`` under the job's shared state
  (``JobPaths.state``: s3://, webhdfs:// or a local path) with an atomic put once it listens,
  refreshes its ``heartbeat_at`` every ``HEARTBEAT_SECONDS`` and removes it on a clean stop; an
  entry whose heartbeat is older than ``STALE_SECONDS`` (a killed executor) is not served. Any
  host that reaches the shared state finds the executors (heartbeats compare wall clocks: hosts
  must agree within a few seconds).

Each discovery also says where the executors' credential is (``token``, read and checked by
``primus_lib.data.flight_auth``): the job's Flight token beside the registry
(``<registry>/.flight-token``: the local root's ``resources/executors/`` or the shared state's
``executors/``), on Kubernetes the mounted Secret; a static list gets the backend's own place.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from primus_lib.paths import JobPaths
from primus_lib.resources.table import write_json
from primus_lib.settings import settings
from primus_lib.spec.job import PrimusJob
from primus_lib.storage import Where, locate

log = logging.getLogger(__name__)

ROLE = "stream_executor"
ENV_LOCATIONS = "PRIMUS_STREAM_EXECUTORS"
TOKEN_NAME = ".flight-token"  # the job's Flight token, beside the executors' registry


@dataclass(frozen=True)
class TokenFile:
    """Where the job's Flight token is: made there on first use, unless ``create`` is False (a
    mounted Secret)."""

    where: Where
    create: bool = True


def executor_replicas(job: PrimusJob, role: str = ROLE) -> int:
    """How many executors serve each stream: the role's replicas (0 = no executors)."""
    spec = job.spec.resources.roles.get(role)
    return 0 if spec is None else spec.replicas


class ExecutorDiscovery(ABC):
    token: TokenFile | None = None  # the job's Flight token: every call to the executors carries it

    @abstractmethod
    def locations(self) -> dict[int, str]:
        """Executor index -> Flight location, of the executors serving now."""

    def describe(self) -> str:
        """Where the executors are looked for, for a person reading a log line."""
        return type(self).__name__

    def register(self, index: int, location: str, info: dict) -> None:  # noqa: B027 - optional
        """Announce executor ``index`` (called by the executor once it listens)."""

    def unregister(self, index: int) -> None:  # noqa: B027
        """Withdraw executor ``index`` (a clean stop)."""


class StaticDiscovery(ExecutorDiscovery):
    def __init__(self, locations: list[str], token: TokenFile | None = None):
        self._locations = {i: loc for i, loc in enumerate(locations)}
        self.token = token

    def locations(self) -> dict[int, str]:
        return dict(self._locations)


class LocalDiscovery(ExecutorDiscovery):
    def __init__(self, directory: Path):
        self.directory = directory
        self.token = TokenFile(directory.parent / TOKEN_NAME)

    @classmethod
    def for_stream(cls, job: PrimusJob, stream: str) -> LocalDiscovery:
        return cls(JobPaths.for_job(job).root / "resources" / "executors" / stream)

    def describe(self) -> str:
        return f"the registry {self.directory}"

    def _path(self, index: int) -> Path:
        return self.directory / f"{index}.json"

    def register(self, index: int, location: str, info: dict) -> None:
        write_json(self._path(index), {**info, "index": index, "location": location, "pid": os.getpid()})

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


HEARTBEAT_SECONDS = 3.0  # an executor refreshes its shared-state entry this often
STALE_SECONDS = 3 * HEARTBEAT_SECONDS  # an entry not refreshed for this long is a dead executor's
WILDCARDS = ("0.0.0.0", "::", "[::]")  # a bind-everything address: advertise the host's name instead


def advertised(location: str) -> str:
    """``location`` with a wildcard host replaced by this host's name (YARN's $NM_HOST in a container)."""
    scheme, _, rest = location.partition("://")
    host, _, port = rest.rpartition(":")
    if host not in WILDCARDS:
        return location
    return f"{scheme}://{settings().nm_host or socket.getfqdn()}:{port}"


class SharedStateDiscovery(ExecutorDiscovery):
    """Entries under the job's shared state, kept fresh by a heartbeat thread in each executor."""

    def __init__(self, directory: Where, heartbeat: float = HEARTBEAT_SECONDS, stale: float = STALE_SECONDS):
        self.directory = locate(directory)
        self.token = TokenFile(self.directory.parent / TOKEN_NAME)
        self.heartbeat, self.stale = heartbeat, stale
        self._beats: dict[int, tuple[threading.Event, threading.Thread]] = {}

    @classmethod
    def for_stream(cls, job: PrimusJob, stream: str) -> SharedStateDiscovery:
        return cls(JobPaths.for_job(job).state / "executors" / stream)

    def describe(self) -> str:
        return f"the registry {self.directory}"

    def _put(self, index: int, body: dict) -> None:
        # not fsynced: a registry entry is stale seconds after a crash anyway
        (self.directory / f"{index}.json").put_atomic(json.dumps(body).encode(), durable=False)

    def register(self, index: int, location: str, info: dict) -> None:
        now = time.time()
        body = {
            **info,
            "index": index,
            "location": advertised(location),
            "pid": os.getpid(),
            "host": socket.getfqdn(),
            "started_at": now,
            "heartbeat_at": now,
        }
        self._put(index, body)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat):
                try:
                    self._put(index, {**body, "heartbeat_at": time.time()})
                except Exception:  # storage hiccup: the next beat tries again (stale only if they all fail)
                    log.exception("executor %d: heartbeat to %s failed", index, self.directory)

        thread = threading.Thread(target=beat, name=f"executor-heartbeat-{index}", daemon=True)
        self._beats[index] = (stop, thread)
        thread.start()

    def unregister(self, index: int) -> None:
        beat = self._beats.pop(index, None)
        if beat is not None:
            stop, thread = beat
            stop.set()
            thread.join(self.heartbeat + 30)
        (self.directory / f"{index}.json").delete()

    def entries(self) -> dict[int, dict]:
        """Index -> entry of the executors whose heartbeat is fresh."""
        names = [e.name for e in self.directory.list() if not e.is_dir]
        out, now = {}, time.time()
        for name in sorted(n for n in names if n.endswith(".json") and not n.startswith(".")):
            try:
                entry = json.loads((self.directory / name).read_text())
            except (OSError, ValueError):
                continue  # removed meanwhile (a clean stop)
            if now - float(entry.get("heartbeat_at", 0)) <= self.stale:
                out[int(entry["index"])] = entry
        return out

    def locations(self) -> dict[int, str]:
        return {i: e["location"] for i, e in sorted(self.entries().items())}


def discovery_for(job: PrimusJob, stream: str) -> ExecutorDiscovery:
    """$PRIMUS_STREAM_EXECUTORS when set, else the backend's own way (local: the ports files, or
    the shared state when the storage root is remote; yarn: the shared state; kubernetes: the
    executors' headless Service's Endpoints)."""
    raw = (settings().stream_executors or "").strip()
    if raw:
        own = _backend_discovery(job, stream)  # where the job's token is
        return StaticDiscovery([part.strip() for part in raw.split(",") if part.strip()], own.token)
    return _backend_discovery(job, stream)


def _backend_discovery(job: PrimusJob, stream: str) -> ExecutorDiscovery:
    backend = job.spec.resources.backend
    if backend == "kubernetes":
        from primus_lib.resources.kubernetes.discovery import KubernetesDiscovery

        return KubernetesDiscovery.for_job(job, stream)
    if backend == "yarn" or (backend == "local" and JobPaths.for_job(job).shared is not None):
        return SharedStateDiscovery.for_stream(job, stream)
    if backend != "local":
        raise NotImplementedError(
            f"stream executor discovery on the {backend} backend is not built yet: set ${ENV_LOCATIONS}"
        )
    return LocalDiscovery.for_stream(job, stream)
