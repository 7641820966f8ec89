"""How executors and trainers report on the embedded default: snapshots written at most every few
seconds (never per row), old snapshots pruned, an optional /metrics endpoint, and no metrics
failure ever reaching the training or data task that reports (metrics are advisory).

Each snapshot is put atomically (whole or absent, never torn) into ``JobPaths.metrics_dir``, a
``primus_lib.storage`` location: the job's directory or its remote root."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from primus_lib.metrics.instruments import serve, write_snapshot
from primus_lib.settings import settings
from primus_lib.storage import Where, locate

if TYPE_CHECKING:
    from primus_lib.spec import PrimusJob

log = logging.getLogger("primus.metrics")

PORT_ENV = "PRIMUS_METRICS_PORT"  # also serve /metrics on 127.0.0.1:<port + offset>
TOKEN_FILE = "metrics.token"  # ... to scrapers presenting this bearer token (in $PRIMUS_SECRETS_DIR)
SNAPSHOT_EVERY_SECONDS = 5.0
# a scaling decision reads reports at most this fraction of its interval old (``report_every``)
REPORTS_PER_DECISION = 12
MIN_REPORT_EVERY_SECONDS = 1.0
STALE_SECONDS = 300.0  # TextfileReader's default: older snapshots are a dead worker's last words
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def report_every(job: PrimusJob) -> float:
    """Seconds between a stream executor's or a trainer's reports: a twelfth of the scaler's interval,
    within 1-5 s. At the default minute a decision reads reports at most 5 s old; a job deciding every
    5 s had read them up to 5 s old too, so a surge that began just after a report waited a whole
    extra interval for its executors (docs/scaling.md)."""
    interval = job.spec.scaling.interval.total_seconds()
    return min(SNAPSHOT_EVERY_SECONDS, max(MIN_REPORT_EVERY_SECONDS, interval / REPORTS_PER_DECISION))


def snapshot_name(*parts: object) -> str:
    """A file-name-safe snapshot name (task ids carry '/' and ':')."""
    return _UNSAFE.sub("_", "-".join(str(p) for p in parts))[:200]


def guarded(what: str, fn: Callable[[], object]) -> None:
    """Run ``fn``; a failure is logged (once per message) and swallowed."""
    try:
        fn()
    except Exception as exc:  # metrics must never break the work they describe
        message = f"{type(exc).__name__}: {exc}"
        if message not in _warned:
            _warned.add(message)
            log.warning("metrics: %s failed (%s); continuing without", what, message)


_warned: set[str] = set()


def prune_stale(directory: Where, max_age: float = 2 * STALE_SECONDS) -> int:
    """Remove snapshots older than ``max_age`` (the readers ignore them anyway); returns how many."""
    removed, now = 0, time.time()
    directory = locate(directory)
    for entry in directory.list():
        if entry.name.endswith(".prom") and entry.mtime is not None and now - entry.mtime > max_age:
            (directory / entry.name).delete()
            removed += 1
    return removed


def write_snapshot_to(directory: Where, name: str, registry: CollectorRegistry) -> None:
    """Write ``registry`` to ``directory/<name>.prom`` atomically."""
    write_snapshot(directory, name, registry)


class SnapshotWriter:
    """Writes ``registry`` to ``directory/<name>.prom`` at most once per ``every`` seconds."""

    def __init__(
        self,
        directory: Where,
        name: str,
        registry: CollectorRegistry,
        every: float = SNAPSHOT_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory, self.name, self.registry = locate(directory), name, registry
        self.every, self.clock = every, clock
        self.last = float("-inf")
        self._wanted = threading.Event()  # a write asked of the background thread (``write_later``)
        self._closing = False
        self._thread: threading.Thread | None = None

    def due(self) -> bool:
        return self.clock() - self.last >= self.every

    def write(self) -> None:
        """Write now (atomically)."""
        self.last = self.clock()
        guarded(f"snapshot {self.name}", self._write)

    def write_later(self) -> None:
        """Write from a background thread: the caller is a training loop, and a put into the job's
        directory (a file's create and rename, an object store's PUT: tens of ms) stalled it at
        every checkpoint and report. Requests while one waits are one write (the latest values)."""
        self.last = self.clock()
        if self._thread is None:
            self._thread = threading.Thread(target=self._background, name="primus-metrics", daemon=True)
            self._thread.start()
        self._wanted.set()

    def _background(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._closing:
                return
            guarded(f"snapshot {self.name}", self._write)

    def close(self) -> None:
        """Stop the background thread (a write it has not begun is dropped: write() the last one)."""
        if self._thread is not None:
            self._closing = True
            self._wanted.set()
            self._thread.join(timeout=30)
            self._thread = None

    def _write(self) -> None:
        write_snapshot_to(self.directory, self.name, self.registry)

    def maybe_write(self) -> bool:
        if not self.due():
            return False
        self.write()
        return True


def serve_from_env(registry: CollectorRegistry, offset: int = 0) -> int | None:
    """Serve ``registry`` on 127.0.0.1:<$PRIMUS_METRICS_PORT + offset> when the setting is there
    (ranks on one host pass their local rank as offset), to scrapers presenting the bearer token
    of the mounted secret ``$PRIMUS_SECRETS_DIR/metrics.token``; returns the port, None when not
    served (no port; no token: never an endpoint without a login)."""
    try:
        config = settings()
        base = config.metrics_port
        if base is None:
            return None
        token_file = config.secrets_dir / TOKEN_FILE if config.secrets_dir else None
        if token_file is None or not token_file.exists():
            log.warning(
                "metrics: %s is set but no %s is mounted: /metrics not served", PORT_ENV, token_file or TOKEN_FILE
            )
            return None
        port = base + offset
        serve(port, token_file.read_text(encoding="utf-8").strip(), registry=registry)
    except Exception as exc:  # a taken port, an unreadable token or setting must not stop training
        log.warning("metrics: cannot serve on 127.0.0.1:%s+%d: %s", PORT_ENV, offset, exc)
        return None
    log.info("metrics: serving /metrics on 127.0.0.1:%d", port)
    return port
