"""A stream executor stopped by a scale-down takes its metrics snapshot with it: the scaler reads
the job's snapshot files for 5 minutes, and a stopped executor's last words made it count executors
that were gone (4 "reporting" after 4 -> 1, their stale CPU and lag in its means)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from primus_lib.metrics.readers import TextfileReader
from primus_lib.paths import JobPaths
from primus_lib.scaling.horizontal import STREAM_ROLE
from primus_lib.spec import load_job

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, bootstrap: str, topic: str) -> Path:
    doc = yaml.safe_load((ROOT / "config" / "jobs" / "ctr-demo.yaml").read_text())
    doc["metadata"]["name"] = f"down-{topic}"
    doc["spec"]["dataset"]["streams"][1]["sources"][0]["kafka"].update(bootstrap_servers=bootstrap, topic=topic)
    doc["spec"]["storage"] = {"root": str(tmp_path / "jobs")}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_stopped_executor_leaves_no_snapshot_behind(kafka_broker, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    spec = _spec(tmp_path, kafka_broker.bootstrap, kafka_broker.new_topic(partitions=1))
    job = load_job(spec)
    metrics = JobPaths.for_job(job).metrics_dir
    snapshot = Path(metrics) / "stream_executor-realtime-0.prom"
    cmd = [sys.executable, "-m", "primus_lib.cli.main", "executor", str(spec), "--index", "0", "--replicas", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not snapshot.exists():  # written every 5 s, trainer or not
            assert proc.poll() is None, f"the executor exited {proc.returncode}"
            assert time.monotonic() < deadline, "no metrics snapshot from the executor"
            time.sleep(0.25)
        assert TextfileReader(job.name, metrics, STREAM_ROLE).snapshot().executors == 1
        proc.send_signal(signal.SIGTERM)  # what the supervisor sends on a scale-down
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not snapshot.exists()
    assert TextfileReader(job.name, metrics, STREAM_ROLE).snapshot() is None
