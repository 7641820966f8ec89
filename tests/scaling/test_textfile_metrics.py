"""The embedded default without a Prometheus server: executor and trainer processes write metric
snapshots into the job's metrics dir; the scaler reads them (TextfileReader) and decides."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from primus_lib.metrics.readers import TextfileReader
from primus_lib.paths import JobPaths
from primus_lib.scaling.step import reader_for, scaling_step
from tests.resources.conftest import make_job

WRITER = """
import sys
from prometheus_client import CollectorRegistry
from primus_lib.metrics import ExecutorMetrics, TrainerMetrics, write_snapshot
directory, worker, fill = sys.argv[1], sys.argv[2], float(sys.argv[3])
registry = CollectorRegistry()
if worker == "trainer":
    TrainerMetrics("ctr-demo", registry=registry).observe_step(wait_seconds=0.25, total_seconds=1.0)
else:
    m = ExecutorMetrics("ctr-demo", worker=worker, cpu_limit=2, memory_limit=2**30, registry=registry)
    m.observe_buffer(fill, 1.0)
    m.observe_process()
write_snapshot(directory, f"w-{worker}", registry)
"""


def test_snapshots_from_other_processes_drive_a_scaling_step(job_env):
    job = make_job({"data_executor": {"replicas": 2, "min_replicas": 1, "max_replicas": 8, "cpu": 2, "memory": "1Gi"},
                    "trainer": {"command": ["true"]}})  # fmt: skip
    metrics_dir = JobPaths.for_job(job).metrics_dir
    for worker, fill in (("0", 0.0), ("1", 0.1), ("trainer", 0.0)):
        subprocess.run([sys.executable, "-c", WRITER, str(metrics_dir), worker, str(fill)], check=True, env=os.environ)
    stale = metrics_dir / "w-old.prom"
    stale.write_text((metrics_dir / "w-0.prom").read_text().replace('worker="0"', 'worker="old"'))
    os.utime(stale, (time.time() - 3600, time.time() - 3600))

    reader = reader_for(job, "data_executor", None)
    assert isinstance(reader, TextfileReader)
    snap = reader.snapshot()
    assert snap.executors == 2  # the stale file is ignored
    assert snap.buffer == pytest.approx(0.05)
    assert snap.trainer_starved == pytest.approx(0.25)
    assert snap.memory_bytes_max > 10 * 2**20  # the writers' real RSS
    decisions = scaling_step(job)
    assert [d.action for d in decisions] == ["scale_up"] and decisions[0].replicas == 3
