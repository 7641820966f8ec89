from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from primus_lib.data.dtgg import plan_source
from primus_lib.data.executor import task as task_module
from primus_lib.data.executor.task import staging_path
from primus_lib.metrics.instruments import ExecutorMetrics
from primus_lib.resources import limits, proctree
from primus_lib.scaling.forecast import forecast_change
from primus_lib.scaling.step import scaling_step
from primus_lib.scaling.vertical import VerticalPolicy
from primus_lib.spec.scaling import VerticalScaling
from tests.data.helpers import T0, write_layout
from tests.fixtures.specs import demo_doc, load
from tests.scaling.helpers import GIB, context, history, snapshot

POLICY = VerticalPolicy(VerticalScaling())  # lookback 10m, margin 0.15, min_change 0.25


def test_paper_case_ten_cores_down_to_six():
    usage = [5.0, 5.1, 5.2, 5.1, 5.2, 5.2]
    d = POLICY.decide(context(snapshot(), cpu=10.0, memory=8 * GIB, history=history(usage, [6 * GIB] * 6)))
    expected = 5.2 + forecast_change(usage) + 0.15 * 5.2
    assert d.action == "resize" and d.cpu == pytest.approx(round(expected + 0.05, 1), abs=0.1)
    assert 5.9 <= d.cpu <= 6.1
    assert "peak 5.20" in d.reason and d.inputs["cpu_peak"] == 5.2


def test_rising_usage_grows_by_forecast():
    usage = [2.0, 2.5, 3.0, 3.5, 4.0]
    d = POLICY.decide(context(snapshot(), cpu=3.0, memory=8 * GIB, history=history(usage)))
    assert d.cpu > 4.0 * 1.15  # peak + positive forecast + margin


def test_small_changes_are_skipped():
    usage = [3.3, 3.4, 3.35]
    assert POLICY.decide(context(snapshot(), cpu=4.0, memory=4.6 * GIB, history=history(usage, [4 * GIB] * 3))) is None


def test_old_samples_are_outside_the_lookback():
    points = history([9.0, 9.0, 1.0, 1.0, 1.0, 1.0], step=180.0)  # the 9s are > 10 minutes old
    d = POLICY.decide(context(snapshot(), cpu=10.0, memory=8 * GIB, history=points))
    assert d.cpu < 2.0


def test_too_few_samples_hold():
    assert POLICY.decide(context(snapshot(), history=history([1.0, 1.0]))) is None


def test_oom_kill_grows_memory_at_once():
    ctx = context(snapshot(ooms=1), memory=8 * GIB, history=history([3.9, 3.9, 3.9], [4 * GIB] * 3), ooms=1)
    assert POLICY.urgent(ctx)
    d = POLICY.decide(ctx)
    assert d.memory == pytest.approx(12 * GIB) and "OOM" in d.reason
    assert d.memory > 8 * GIB  # never shrinks memory right after an OOM kill


# -- a resize decision takes effect: the next data task runs with its threads and under its cap --------
MIB = 2**20


@pytest.fixture
def resized_job(tmp_path, monkeypatch):
    """The demo job over tiny data; three scaler steps on executors using 2.6 cores and 200 MiB, so
    the vertical policy resizes them (horizontal off): cpu 1 -> 3, memory 2Gi -> 256 MiB."""
    monkeypatch.setenv("PRIMUS_CGROUP", "off")  # the RSS guard, whatever this machine allows
    # the task runs in pytest's process, whose RSS the guard measures whole: its hard cap (a SIGKILL)
    # stays far above the cap under test (test_limits checks the real factor in a process of its own)
    monkeypatch.setattr(limits, "MEMORY_HARD_FACTOR", 8.0)
    monkeypatch.setattr(proctree, "descendants", lambda pid: [])  # the session's servers are not the task's
    write_layout(tmp_path / "data", hours=1, rows=50, files=1)
    doc = demo_doc(f"file://{tmp_path / 'data'}", hours=1, rows_per_shard=100)
    doc["spec"]["scaling"]["horizontal"]["enabled"] = False
    job = load(doc, storage=tmp_path / "home" / "jobs")
    registry = CollectorRegistry()
    executor = ExecutorMetrics(job.name, "t0", 1, 2 * GIB, registry=registry)
    executor.observe_buffer(0.5, 1.0)
    executor.observe_usage(2.6, 200 * MIB)
    decisions = [d for _ in range(3) for d in scaling_step(job, registry=registry)]
    assert [(d.action, d.cpu, d.memory) for d in decisions] == [("resize", 3.0, 256 * MIB)]
    return job


def _run_task(job, monkeypatch, allocate: int = 0):
    """Run the job's first data task; inside it record the thread counts and the enforcement, and
    allocate (and touch) ``allocate`` bytes, held for up to 2 s."""
    seen: dict = {}
    real = task_module.read_task

    def read_task(job, task):
        seen.update(cpu=pa.cpu_count(), io=pa.io_thread_count(), enforcement=limits.active())
        if seen["enforcement"].cgroup is not None:
            path = seen["enforcement"].cgroup.path
            seen["cgroup"] = {f: (path / f).read_text() for f in ("memory.high", "memory.max", "cpu.max")}
        held = bytearray(b"\x01") * allocate
        for _ in range(40 if allocate else 0):
            time.sleep(0.05)
        del held
        return real(job, task)

    monkeypatch.setattr(task_module, "read_task", read_task)
    task = plan_source(job, "history", "impressions", T0)[0]
    try:
        return seen, task_module.execute_task(job, task)
    finally:
        seen["after"] = pa.cpu_count()


def test_the_next_data_task_runs_with_the_decided_threads_and_cap(resized_job, monkeypatch):
    before = pa.cpu_count()
    seen, output = _run_task(resized_job, monkeypatch, allocate=64 * MIB)  # under the cap: passes
    assert output.rows > 0
    assert seen["cpu"] == seen["io"] == 3 and seen["after"] == before
    enforcement = seen["enforcement"]
    assert enforcement.limits.memory == 256 * MIB and enforcement.memory == "rss guard"


def test_a_data_task_past_the_decided_cap_fails_naming_itself(resized_job, monkeypatch):
    task = plan_source(resized_job, "history", "impressions", T0)[0]
    with pytest.raises(limits.MemoryCapExceeded) as failed:
        _run_task(resized_job, monkeypatch, allocate=320 * MIB)
    assert str(failed.value).startswith(f"data task {task.id}: executor memory cap 256.0 MiB exceeded (RSS ")
    assert limits.active() is None and not staging_path(resized_job, task).exists()


def test_with_cgroup_v2_the_task_cgroup_gets_the_decided_limits(resized_job, monkeypatch, tmp_path):
    """A stand-in cgroup v2 directory (the machine running this may have none, see docs/scaling.md):
    the task's child cgroup gets memory.high = the cap, memory.max = the hard cap, cpu.max = the cores."""
    own = tmp_path / "cgroup"
    own.mkdir()
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("cpu memory\n")
    monkeypatch.setenv("PRIMUS_CGROUP", str(own))
    seen, _ = _run_task(resized_job, monkeypatch)
    assert seen["enforcement"].memory == "cgroup v2" and seen["cpu"] == 3
    assert seen["cgroup"] == {
        "memory.high": str(256 * MIB),
        "memory.max": str(int(256 * MIB * limits.MEMORY_HARD_FACTOR)),
        "cpu.max": "300000 100000",
    }
    assert (own / "cgroup.procs").read_text() == str(os.getpid())  # moved back after the task
