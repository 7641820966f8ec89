"""The scaling manager reading a real Prometheus server that scrapes real executor and trainer
processes (prometheus_client.start_http_server on 127.0.0.1), instrumented with primus_lib.metrics."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

from primus_lib.metrics.readers import PrometheusReader
from primus_lib.scaling import ScalingManager
from tests.fixtures._proc import free_port
from tests.scaling.helpers import job

pytestmark = pytest.mark.integration

EXECUTOR = """
import sys, time
from prometheus_client import CollectorRegistry
from primus_lib.metrics import ExecutorMetrics, serve
port, fill, busy = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "busy"
registry = CollectorRegistry()
metrics = ExecutorMetrics("ctr-demo", worker=str(port), cpu_limit=1, memory_limit=2**30, registry=registry)
serve(port, registry=registry)
while True:
    end = time.monotonic() + 0.2
    while busy and time.monotonic() < end:
        pass  # real CPU use, measured by psutil
    if not busy:
        time.sleep(0.2)
    metrics.observe_buffer(fill * 1000, 1000)
    metrics.observe_process()
    metrics.add_samples(100)
"""

TRAINER = """
import sys, time
from prometheus_client import CollectorRegistry
from primus_lib.metrics import TrainerMetrics, serve
registry = CollectorRegistry()
metrics = TrainerMetrics("ctr-demo", registry=registry)
serve(int(sys.argv[1]), registry=registry)
while True:
    metrics.observe_step(wait_seconds=0.3, total_seconds=1.0)  # waits 30% of each step for data
    time.sleep(0.2)
"""


@pytest.fixture
def workers():
    procs = []

    def spawn(code: str, *args: str) -> int:
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(port), *args]))
        return port

    yield spawn
    for proc in procs:  # the processes this test started, by PID
        proc.kill()
        proc.wait(5)


class Recorder:
    def __init__(self):
        self.applied = []

    def apply(self, decision):
        self.applied.append(decision)


def test_manager_decides_from_a_real_prometheus(prometheus_server, workers, tmp_path):
    executor_ports = [workers(EXECUTOR, "0.05", "busy"), workers(EXECUTOR, "0.10", "idle"),
                      workers(EXECUTOR, "0.15", "idle")]  # fmt: skip
    trainer_port = workers(TRAINER)
    prometheus_server.add_targets("executors", [f"127.0.0.1:{p}" for p in executor_ports])
    prometheus_server.add_targets("trainer", [f"127.0.0.1:{trainer_port}"])
    prometheus_server.wait_for('primus_executor_buffer_utilisation{primus_job="ctr-demo"}', 3)
    prometheus_server.wait_for('primus_trainer_starved_ratio{primus_job="ctr-demo"}', 1)
    prometheus_server.wait_for('primus_executor_cpu_used_cores{primus_job="ctr-demo"} > 0.2', 1)

    reader = PrometheusReader(prometheus_server.url, "ctr-demo")
    snap = reader.snapshot()
    assert snap.executors == 3
    assert snap.buffer == pytest.approx(0.10, abs=1e-6)
    assert snap.trainer_starved == pytest.approx(0.3)
    assert snap.cpu_cores_max > 0.2  # the busy executor, as psutil measured it
    assert 10 * 2**20 < snap.memory_bytes_max < 2**30  # a Python process's real RSS
    history = reader.usage_history(lookback_seconds=60, step_seconds=1)
    assert history and all(p.memory_bytes > 0 for p in history)

    j = job(role={"replicas": 3, "min_replicas": 1, "max_replicas": 10, "cpu": 1, "memory": "1Gi"})
    actuator = Recorder()
    manager = ScalingManager(j, reader, actuator, registry=CollectorRegistry())
    decision = manager.tick()
    assert decision is not None and decision.policy == "horizontal" and decision.action == "scale_up"
    assert decision.replicas == 4  # 3 + ceil(3 x 0.3 / 0.7) = 3 + 2, capped by step 0.25 -> +1
    assert decision.inputs["executors"] == 3 and actuator.applied == [decision]


def test_recording_rules_are_valid():
    import shutil

    from tests.resources.conftest import ROOT

    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian prometheus package)")
    done = subprocess.run(["promtool", "check", "rules", str(ROOT / "config" / "prometheus" / "primus-rules.yml")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and "SUCCESS: 4 rules found" in done.stdout, done.stdout + done.stderr
