"""What a stream executor service reports to the scaler: buffer fill, CPU, memory, samples, and
its lag behind the source (Kafka messages of its partitions not read yet). The lag is what tells
a slow source (executors at the live edge: more of them would not help) from slow executors.

It reports at a twelfth of the scaler's interval (``report_every``: every 5 s at the default minute,
every second for a job that decides every 5 s), and its rates and CPU are over the last
``SPAN_SECONDS`` whatever that period: a Kafka poll brings up to ``--poll-rows`` rows at once, so a
rate over one second swings with the polls' phase."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

import psutil
from prometheus_client import CollectorRegistry

from primus_lib.allocation import role_resources
from primus_lib.metrics.instruments import ExecutorMetrics
from primus_lib.metrics.reporting import (
    SNAPSHOT_EVERY_SECONDS,
    SnapshotWriter,
    guarded,
    report_every,
    serve_from_env,
    snapshot_name,
)
from primus_lib.paths import JobPaths

if TYPE_CHECKING:
    from primus_lib.data.executor.service import ExecutorService

ROLE = "stream_executor"
SPAN_SECONDS = SNAPSHOT_EVERY_SECONDS  # what the rates and the CPU are measured over
T = TypeVar("T")


class Span(Generic[T]):
    """Timed observations, kept back to the newest one at least ``span`` seconds old: the base a
    measure over about ``span`` seconds starts from, however often it is observed."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.seen: deque[tuple[float, T]] = deque()

    def push(self, now: float, value: T) -> tuple[float, T] | None:
        """Keep ``value`` observed at ``now``; the base to compare it with (None: the first)."""
        while len(self.seen) > 1 and self.seen[1][0] <= now - self.span:
            self.seen.popleft()
        base = self.seen[0] if self.seen else None
        self.seen.append((now, value))
        return base


def partition_lags(service: ExecutorService) -> dict[str, int]:
    """Messages not read yet per partition the executor serves (asked of the broker)."""
    return service._lag({})["lag"]


class Rates:
    """Rows read per second and rows per second the partitions received, over about ``span``
    seconds of observations: the source's rate is what was read plus what the lag grew by, over
    partitions served throughout (a span across a rebalance reports what was read only: a partition
    that came or went would count its whole lag as growth)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, span: float = SPAN_SECONDS) -> None:
        self.clock = clock
        self.seen: Span[tuple[int, dict[str, int]]] = Span(span)

    def observe(self, rows_in: int, lags: dict[str, int]) -> tuple[float, float] | None:
        now = self.clock()
        base = self.seen.push(now, (rows_in, dict(lags)))
        if base is None or now <= base[0]:
            return None
        seconds, (rows_then, lags_then) = now - base[0], base[1]
        read = (rows_in - rows_then) / seconds
        if lags.keys() != lags_then.keys():
            return read, read
        grew = (sum(lags.values()) - sum(lags_then.values())) / seconds
        return read, max(0.0, read + grew)


def _cpu_seconds_of(process: psutil.Process) -> Callable[[], float]:
    def used() -> float:
        times = process.cpu_times()
        return times.user + times.system

    return used


class Cores:
    """Cores busy over about ``span`` seconds (this process's, children not counted as in
    ``ExecutorMetrics.observe_process``, unless ``cpu_seconds`` says otherwise)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        span: float = SPAN_SECONDS,
        cpu_seconds: Callable[[], float] | None = None,
    ) -> None:
        self.clock, self.cpu_seconds = clock, cpu_seconds or _cpu_seconds_of(psutil.Process())
        self.seen: Span[float] = Span(span)

    def observe(self) -> float | None:
        now, used = self.clock(), self.cpu_seconds()
        base = self.seen.push(now, used)
        return None if base is None or now <= base[0] else (used - base[1]) / (now - base[0])


def report(service: ExecutorService, every: float | None = None) -> threading.Thread:
    """Write the executor's metrics ``<job>/metrics/stream_executor-<stream>-<index>.prom`` every
    ``every`` seconds (default ``report_every``), and serve /metrics on
    127.0.0.1:$PRIMUS_METRICS_PORT+index when that is set; the file is removed once the service stops
    (a killed executor's stays until the readers ignore it)."""
    every = report_every(service.job) if every is None else every
    role = service.job.spec.resources.roles.get(ROLE)  # its allotment: the scaler's latest, else the spec
    cpu, memory = role_resources(service.job, ROLE) if role else (1.0, float(2**31))
    registry = CollectorRegistry()
    worker = f"{service.stream_name}-{service.index}"
    metrics = ExecutorMetrics(service.job.name, worker, cpu, memory, role=ROLE, registry=registry)
    writer = SnapshotWriter(
        JobPaths.for_job(service.job).metrics_dir, snapshot_name(ROLE, worker), registry, every=every
    )
    serve_from_env(registry, offset=service.index)

    rates, cores = Rates(), Cores()

    def lag() -> None:
        lags, rows_in = partition_lags(service), service.rows_in
        metrics.observe_lag(sum(lags.values()))
        if (observed := rates.observe(rows_in, lags)) is not None:
            metrics.observe_rates(*observed)

    def loop() -> None:
        counted = 0
        guarded("executor lag behind Kafka", lambda: rates.observe(service.rows_in, partition_lags(service)))
        guarded("executor CPU", cores.observe)
        while not service._stop.wait(every):
            metrics.observe_buffer(service.filled, service.buffer.capacity)
            guarded("executor process metrics", lambda: metrics.observe_process(cores.observe()))
            guarded("executor lag behind Kafka", lag)
            metrics.add_samples(service.rows_in - counted)
            counted = service.rows_in
            writer.write()
        # stopped (a scale-down, a restart): no last words, or the scaler counts it as running for minutes
        guarded("removing the executor's snapshot", lambda: (writer.directory / f"{writer.name}.prom").delete())

    thread = threading.Thread(target=loop, name="executor-metrics", daemon=True)
    thread.start()
    return thread
