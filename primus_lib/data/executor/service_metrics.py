"""What a stream executor service reports to the scaler: buffer fill, CPU, memory, samples, and
its lag behind the source (Kafka messages of its partitions not read yet). The lag is what tells
a slow source (executors at the live edge: more of them would not help) from slow executors."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from primus_lib.allocation import role_resources
from primus_lib.metrics.instruments import ExecutorMetrics
from primus_lib.metrics.reporting import SnapshotWriter, guarded, serve_from_env, snapshot_name
from primus_lib.paths import JobPaths

if TYPE_CHECKING:
    from primus_lib.data.executor.service import ExecutorService

ROLE = "stream_executor"


def partition_lags(service: ExecutorService) -> dict[str, int]:
    """Messages not read yet per partition the executor serves (asked of the broker)."""
    return service._lag({})["lag"]


class Rates:
    """Rows read per second and rows per second the partitions received, between two observations:
    the source's rate is what was read plus what the lag grew by, over partitions served throughout
    (an interval across a rebalance reports what was read only: a partition that came or went would
    count its whole lag as growth)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last: tuple[float, int, dict[str, int]] | None = None

    def observe(self, rows_in: int, lags: dict[str, int]) -> tuple[float, float] | None:
        now = self.clock()
        last, self.last = self.last, (now, rows_in, dict(lags))
        if last is None or now <= last[0]:
            return None
        seconds = now - last[0]
        read = (rows_in - last[1]) / seconds
        if lags.keys() != last[2].keys():
            return read, read
        grew = (sum(lags.values()) - sum(last[2].values())) / seconds
        return read, max(0.0, read + grew)


def report(service: ExecutorService, every: float = 5.0) -> threading.Thread:
    """Write the executor's metrics ``<job>/metrics/stream_executor-<stream>-<index>.prom`` every
    ``every`` seconds, and serve /metrics on 127.0.0.1:$PRIMUS_METRICS_PORT+index when that is set;
    the file is removed once the service stops (a killed executor's stays until the readers ignore it)."""
    role = service.job.spec.resources.roles.get(ROLE)  # its allotment: the scaler's latest, else the spec
    cpu, memory = role_resources(service.job, ROLE) if role else (1.0, float(2**31))
    registry = CollectorRegistry()
    worker = f"{service.stream_name}-{service.index}"
    metrics = ExecutorMetrics(service.job.name, worker, cpu, memory, role=ROLE, registry=registry)
    writer = SnapshotWriter(
        JobPaths.for_job(service.job).metrics_dir, snapshot_name(ROLE, worker), registry, every=every
    )
    serve_from_env(registry, offset=service.index)

    rates = Rates()

    def lag() -> None:
        lags, rows_in = partition_lags(service), service.rows_in
        metrics.observe_lag(sum(lags.values()))
        if (observed := rates.observe(rows_in, lags)) is not None:
            metrics.observe_rates(*observed)

    def loop() -> None:
        counted = 0
        guarded("executor lag behind Kafka", lambda: rates.observe(service.rows_in, partition_lags(service)))
        while not service._stop.wait(every):
            metrics.observe_buffer(service.filled, service.buffer.capacity)
            guarded("executor process metrics", metrics.observe_process)
            guarded("executor lag behind Kafka", lag)
            metrics.add_samples(service.rows_in - counted)
            counted = service.rows_in
            writer.write()
        # stopped (a scale-down, a restart): no last words, or the scaler counts it as running for minutes
        guarded("removing the executor's snapshot", lambda: (writer.directory / f"{writer.name}.prom").delete())

    thread = threading.Thread(target=loop, name="executor-metrics", daemon=True)
    thread.start()
    return thread
