"""Instrumentation helpers: a data executor or trainer makes one object and calls ``observe_*``.

Usage (an executor)::

    metrics = ExecutorMetrics(job="ctr-demo", worker="3", cpu_limit=2, memory_limit=4 * 2**30)
    serve(port, token)                         # optional: expose /metrics for Prometheus
    metrics.observe_buffer(fill_rows, capacity_rows)
    metrics.observe_process()                  # CPU of this process, RSS of its tree
"""

from __future__ import annotations

import hmac
import os
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

import psutil
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from primus_lib.metrics import names as n
from primus_lib.metrics.registry import registered
from primus_lib.resources.proctree import rss, tree
from primus_lib.storage import Where, locate

_LABELS = (n.JOB_LABEL, n.ROLE_LABEL, n.WORKER_LABEL)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """A scrape every few seconds is not news."""


def serve(port: int, token: str, addr: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY):
    """Expose ``registry`` on http://addr:port/metrics to a scraper presenting ``Authorization:
    Bearer <token>`` (Prometheus: ``authorization.credentials_file``); any other request gets 401
    before the registry is read. Returns (server, thread): ``server.shutdown()`` stops it."""
    if not token:
        raise ValueError("a /metrics endpoint needs a token: every endpoint asks for a login")
    app = make_wsgi_app(registry)
    expected = f"Bearer {token}".encode()

    def guarded(environ, start_response):
        given = environ.get("HTTP_AUTHORIZATION", "").encode()
        if not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Bearer realm="primus"')])
            return [b"401 Unauthorized: a bearer token is required\n"]
        return app(environ, start_response)

    server = make_server(addr, port, guarded, ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="primus-metrics", daemon=True)
    thread.start()
    return server, thread


def write_snapshot(directory: Where, name: str, registry: CollectorRegistry = REGISTRY) -> None:
    """Write ``registry`` to ``directory/<name>.prom`` atomically (Prometheus text format): how a
    process without an HTTP endpoint reports to the scaler (primus_lib.metrics.readers.TextfileReader).
    Call it every few seconds; the job's directory is ``JobPaths.for_job(job).metrics_dir``. Not
    fsynced: a snapshot is advisory and replaced seconds later."""
    from prometheus_client import generate_latest

    (locate(directory) / f"{name}.prom").put_atomic(generate_latest(registry), durable=False)


def _gauge(registry: CollectorRegistry, name: str, doc: str) -> Gauge:
    return registered(registry, name, Gauge) or Gauge(name, doc, _LABELS, registry=registry)


def _counter(registry: CollectorRegistry, name: str, doc: str) -> Counter:
    return registered(registry, name, Counter) or Counter(name, doc, _LABELS, registry=registry)


class ExecutorMetrics:
    """Gauges of one data executor: buffer fill, CPU and memory utilisation against its limits."""

    def __init__(
        self,
        job: str,
        worker: str,
        cpu_limit: float,
        memory_limit: float,
        role: str = "data_executor",
        registry: CollectorRegistry = REGISTRY,
        pid: int | None = None,
    ) -> None:
        self.labels = {n.JOB_LABEL: job, n.ROLE_LABEL: role, n.WORKER_LABEL: str(worker)}
        self.cpu_limit, self.memory_limit = float(cpu_limit), float(memory_limit)
        self.buffer = _gauge(registry, n.BUFFER_UTILISATION, "Sample buffer fill, 0..1").labels(**self.labels)
        self.cpu = _gauge(registry, n.CPU_UTILISATION, "Used / allocated cores, 0..1").labels(**self.labels)
        self.memory = _gauge(registry, n.MEMORY_UTILISATION, "RSS / memory limit, 0..1").labels(**self.labels)
        self.cores = _gauge(registry, n.CPU_USED_CORES, "Cores used").labels(**self.labels)
        self.rss = _gauge(registry, n.MEMORY_USED_BYTES, "Resident memory, bytes").labels(**self.labels)
        # a zero series: a killed worker cannot count its own kill, the local supervisor does (supervisor.py)
        self.ooms = _counter(registry, n.OOM_KILLS, "OOM kills of this executor").labels(**self.labels)
        self.samples = _counter(registry, n.SAMPLES, "Samples produced").labels(**self.labels)
        self.registry = registry
        self.lag: Gauge | None = None  # stream executors only: made on the first observe_lag
        self.rates: tuple[Gauge, Gauge] | None = None  # stream executors only: made on the first observe_rates
        self._proc = psutil.Process(pid or os.getpid())
        self._proc.cpu_percent(None)

    def observe_buffer(self, filled: float, capacity: float) -> None:
        self.buffer.set(0.0 if capacity <= 0 else min(1.0, max(0.0, filled / capacity)))

    def observe_usage(self, cores: float, rss_bytes: float) -> None:
        self.cores.set(cores)
        self.rss.set(rss_bytes)
        self.cpu.set(min(1.0, cores / self.cpu_limit) if self.cpu_limit > 0 else 0.0)
        self.memory.set(min(1.0, rss_bytes / self.memory_limit) if self.memory_limit > 0 else 0.0)

    def observe_process(self, cores: float | None = None) -> None:
        """This process's CPU since the last call (psutil; children not counted; ``cores``: measured
        by the caller over its own span), the RSS of its whole process tree now (``proctree``: /proc,
        not psutil's scan of every process on the host)."""
        cores = self._proc.cpu_percent(None) / 100.0 if cores is None else cores
        self.observe_usage(cores, sum(rss(pid) for pid in tree(self._proc.pid)))

    def add_samples(self, count: int) -> None:
        self.samples.inc(count)

    def observe_lag(self, rows: float) -> None:
        """A stream executor's lag behind its source: Kafka messages of its partitions not read yet."""
        if self.lag is None:
            self.lag = _gauge(self.registry, n.STREAM_LAG, "Messages not read yet, rows").labels(**self.labels)
        self.lag.set(max(0.0, float(rows)))

    def observe_rates(self, read: float, source: float) -> None:
        """A stream executor's rows read per second and the rows per second its partitions received,
        over one reporting interval (the interval its CPU utilisation is measured over)."""
        if self.rates is None:
            read_gauge = _gauge(self.registry, n.STREAM_READ_RATE, "Rows read per second")
            source_gauge = _gauge(self.registry, n.STREAM_SOURCE_RATE, "Rows its partitions received per second")
            self.rates = (read_gauge.labels(**self.labels), source_gauge.labels(**self.labels))
        self.rates[0].set(max(0.0, float(read)))
        self.rates[1].set(max(0.0, float(source)))


class TrainerMetrics:
    """A trainer's view of its input: how long it waited for data (starved) or was back-pressured."""

    def __init__(self, job: str, worker: str = "0", registry: CollectorRegistry = REGISTRY) -> None:
        labels = {n.JOB_LABEL: job, n.ROLE_LABEL: "trainer", n.WORKER_LABEL: str(worker)}
        self.starved = _gauge(registry, n.TRAINER_STARVED, "Share of step time waiting for data").labels(**labels)
        self.backpressure = _gauge(registry, n.TRAINER_BACKPRESSURE, "Share of time the input queue was full").labels(
            **labels
        )
        self.samples = _counter(registry, n.TRAINER_SAMPLES, "Samples trained").labels(**labels)

    def observe_step(self, wait_seconds: float, total_seconds: float, queue_full_seconds: float = 0.0) -> None:
        if total_seconds <= 0:
            return
        self.starved.set(min(1.0, max(0.0, wait_seconds / total_seconds)))
        self.backpressure.set(min(1.0, max(0.0, queue_full_seconds / total_seconds)))
