"""What a stream executor service reports to the scaler: buffer fill, CPU, memory, samples, and
its lag behind the source (Kafka messages of its partitions not read yet). The lag is what tells
a slow source (executors at the live edge: more of them would not help) from slow executors."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from primus_lib.allocation import role_resources
from primus_lib.metrics.instruments import ExecutorMetrics
from primus_lib.metrics.reporting import SnapshotWriter, guarded, serve_from_env, snapshot_name
from primus_lib.paths import JobPaths

if TYPE_CHECKING:
    from primus_lib.data.executor.service import ExecutorService

ROLE = "stream_executor"


def lag_rows(service: ExecutorService) -> int:
    """Messages not read yet, summed over the partitions the executor serves (asked of the broker)."""
    return sum(service._lag({})["lag"].values())


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

    def loop() -> None:
        counted = 0
        while not service._stop.wait(every):
            metrics.observe_buffer(service.filled, service.buffer.capacity)
            guarded("executor process metrics", metrics.observe_process)
            guarded("executor lag behind Kafka", lambda: metrics.observe_lag(lag_rows(service)))
            metrics.add_samples(service.rows_in - counted)
            counted = service.rows_in
            writer.write()
        # stopped (a scale-down, a restart): no last words, or the scaler counts it as running for minutes
        guarded("removing the executor's snapshot", lambda: (writer.directory / f"{writer.name}.prom").delete())

    thread = threading.Thread(target=loop, name="executor-metrics", daemon=True)
    thread.start()
    return thread
