"""The embedded default without a Prometheus server: executor and trainer processes write metric
snapshots into the job's metrics dir; the scaler reads them (TextfileReader) and decides."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from primus_lib.metrics.readers import TextfileReader
from primus_lib.paths import JobPaths
from primus_lib.scaling.step import reader_for, scaling_step
from tests.fixtures.specs import demo_doc, load

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
ROLES = {
    "data_executor": {"replicas": 2, "min_replicas": 1, "max_replicas": 8, "cpu": 2, "memory": "1Gi"},
    "trainer": {"command": ["true"]},
}


def test_snapshots_from_other_processes_drive_a_scaling_step(job_env):
    job = load(demo_doc(roles=ROLES), check=False)
    metrics_dir = Path(JobPaths.for_job(job).metrics_dir)  # a local job's directory
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


REMOTE_WRITER = """
import sys
from prometheus_client import CollectorRegistry
from primus_lib.metrics import ExecutorMetrics, TrainerMetrics
from primus_lib.metrics.reporting import SnapshotWriter
directory, worker, fill = sys.argv[1], sys.argv[2], float(sys.argv[3])
registry = CollectorRegistry()
if worker == "trainer":
    TrainerMetrics("ctr-demo", registry=registry).observe_step(wait_seconds=0.25, total_seconds=1.0)
else:
    m = ExecutorMetrics("ctr-demo", worker=worker, cpu_limit=2, memory_limit=2**30, registry=registry)
    m.observe_buffer(fill, 1.0)
    m.observe_process()
SnapshotWriter(directory, f"w-{worker}", registry).write()
"""


def test_snapshots_on_s3_from_other_processes_drive_a_scaling_step(job_env, s3_env):
    """Executors and a trainer on other hosts PUT their snapshots (SnapshotWriter) into the job's
    metrics dir on S3 (SeaweedFS); the scaler lists and reads them there, skipping a stale one."""
    from primus_lib.storage import StorageLocation

    bucket = f"primus-{uuid.uuid4().hex[:8]}"
    s3_env.filesystem().create_dir(bucket)
    job = load(demo_doc(roles=ROLES, storage={"root": f"s3://{bucket}/jobs"}), check=False)
    metrics_dir = JobPaths.for_job(job).metrics_dir
    assert isinstance(metrics_dir, StorageLocation)
    assert not isinstance(reader_for(job, "data_executor", None), TextfileReader)  # nothing written yet

    def write(worker: str, fill: float) -> None:
        subprocess.run(
            [sys.executable, "-c", REMOTE_WRITER, str(metrics_dir), worker, str(fill)], check=True, env=os.environ
        )

    write("old", 0.9)  # a worker that died: its snapshot must not count once stale
    time.sleep(1.5)  # S3 modification times have whole seconds: the old one must be strictly older
    for worker, fill in (("0", 0.0), ("1", 0.1), ("trainer", 0.0)):
        write(worker, fill)
    entries = {e.name: e.mtime for e in metrics_dir.list()}
    assert set(entries) == {"w-old.prom", "w-0.prom", "w-1.prom", "w-trainer.prom"}
    assert not (job_env / "home").exists() or not list((job_env / "home").rglob("*.prom"))  # none on local disk

    reader = reader_for(job, "data_executor", None)
    assert isinstance(reader, TextfileReader)
    assert reader.snapshot().executors == 3  # within 300 s every snapshot counts, the old one too
    fresh = min(t for name, t in entries.items() if name != "w-old.prom")
    cutoff = (entries["w-old.prom"] + fresh) / 2
    snap = TextfileReader(job.name, str(metrics_dir), stale_seconds=time.time() - cutoff).snapshot()
    assert snap.executors == 2  # the stale snapshot is ignored
    assert snap.buffer == pytest.approx(0.05)
    assert snap.trainer_starved == pytest.approx(0.25)
    assert snap.memory_bytes_max > 10 * 2**20  # the writers' real RSS

    (metrics_dir / "w-old.prom").delete()
    decisions = scaling_step(job)
    assert [d.action for d in decisions] == ["scale_up"] and decisions[0].replicas == 3
