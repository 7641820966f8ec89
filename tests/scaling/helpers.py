"""Builders for scaling tests: snapshots, contexts, a job with the policies' defaults."""

from __future__ import annotations

import dataclasses

from primus_lib.metrics.readers import Snapshot, UsagePoint
from primus_lib.scaling.base import Allocation, PolicyContext
from primus_lib.spec import PrimusJob
from tests.fixtures.specs import DEMO_ROLES, demo_doc, load

GIB = 2**30


def snapshot(
    buffer=0.5,
    cpu=0.5,
    memory=0.5,
    starved=0.0,
    backpressure=0.0,
    executors=-1,
    cores=2.0,
    mem_bytes=2 * GIB,
    ooms=0.0,
    at=0.0,
    lag=None,
) -> Snapshot:
    return Snapshot(
        at=at,
        executors=executors,
        buffer=buffer,
        cpu=cpu,
        memory=memory,
        cpu_cores_max=cores,
        memory_bytes_max=mem_bytes,
        oom_kills=ooms,
        trainer_starved=starved,
        trainer_backpressure=backpressure,
        stream_lag=lag,
    )


def context(
    snap: Snapshot,
    replicas=10,
    cpu=4.0,
    memory=8 * GIB,
    lo=1,
    hi=100,
    history=(),
    ooms=0.0,
    now=1000.0,
    role="data_executor",
):
    """A context; the snapshot's reporting executors default to ``replicas`` (none starting)."""
    if snap.executors == -1:
        snap = dataclasses.replace(snap, executors=replicas)
    return PolicyContext(now, snap, Allocation(role, replicas, cpu, memory, lo, hi), list(history), ooms)


def history(cores: list[float], mem: list[float] | None = None, end: float = 1000.0, step: float = 60.0):
    mem = mem or [4 * GIB] * len(cores)
    start = end - step * (len(cores) - 1)
    return [UsagePoint(start + i * step, c, m) for i, (c, m) in enumerate(zip(cores, mem, strict=True))]


def job(scaling: dict | None = None, role: dict | None = None) -> PrimusJob:
    """The demo job with ``scaling`` (default: the policies' defaults) and ``role`` as its data executors."""
    roles = {**DEMO_ROLES, "data_executor": role} if role else DEMO_ROLES
    return load(demo_doc(roles=roles, scaling=scaling or {}), check=False)


# -- a real data executor process, scraped by Prometheus (tests/scaling/test_prometheus.py) ---------


class TaskSnapshots:
    """A collector over the snapshots this process's data tasks wrote (``data_executor-<task>.prom``
    in the job's metrics dir): what ``execute_task``'s own metrics code measured and reported."""

    def __init__(self, directory, names: list[str]) -> None:
        from pathlib import Path

        self.directory, self.names = Path(directory), list(names)

    def collect(self):
        from prometheus_client.parser import text_string_to_metric_families

        for name in self.names:
            path = self.directory / f"{name}.prom"
            if path.exists():
                yield from text_string_to_metric_families(path.read_text())


def run_executor(spec_path: str, window_start: str, stream: str = "history") -> None:
    """A data executor process: serve /metrics on 127.0.0.1:$PRIMUS_METRICS_PORT (the product's
    ``serve_from_env``), run one batch window through the project's executor code (DTGG plan ->
    ``BatchExecutor`` -> ``execute_task`` per data task -> join -> sink: ``run_window``), then stay
    up, serving what its tasks reported, until stopped by PID.

    The batch data task reports by its snapshot file only (``TaskMetrics`` in
    primus_lib/data/executor/metrics.py has no HTTP endpoint, docs/scaling.md), so this process
    serves the snapshots of its own tasks; every value in them comes from the task's metrics code
    (psutil CPU and RSS of this process, rows decoded, the batch backlog it saw)."""
    import time
    from datetime import datetime

    from prometheus_client import CollectorRegistry

    from primus_lib.data.executor import run_window
    from primus_lib.data.executor.metrics import ROLE
    from primus_lib.data.ledger import TaskLedger
    from primus_lib.metrics.reporting import serve_from_env, snapshot_name
    from primus_lib.paths import JobPaths, window_id
    from primus_lib.spec import load_job

    job = load_job(spec_path)
    start = datetime.fromisoformat(window_start)
    paths = JobPaths.for_job(job)
    snapshots = TaskSnapshots(paths.metrics_dir, [])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(snapshots)
    if serve_from_env(registry) is None:
        raise SystemExit("PRIMUS_METRICS_PORT unset, no metrics.token mounted, or the port taken: nothing to scrape")
    result = run_window(job, stream, start, workers=1)
    records = TaskLedger(paths.ledger).records(stream, window_id(start))
    snapshots.names = [snapshot_name(ROLE, record.task.id) for record in records]
    print(f"window {result.queued.window}: {len(records)} tasks, {result.queued.rows} rows", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:  # SIGINT: stopped by the test
        pass


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["executor"] or len(sys.argv) != 4:
        raise SystemExit("usage: python -m tests.scaling.helpers executor SPEC WINDOW_START")
    run_executor(sys.argv[2], sys.argv[3])
