"""primus_lib.resources.cpu_quota: a worker's fractional CPU allotment as a cgroup v1 quota where
cgroup v2 gives none (the machine these were written on: controllers on v1, docs/scaling.md), and the
local backend's supervisor putting a worker under it (the kernel then throttles it at its allotment)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from primus_lib.resources import backend_for
from primus_lib.resources.cpu_quota import CpuQuota, own_v1_cpu_cgroup, v1_cpu_parent
from primus_lib.spec import PrimusJob, load_job
from tests.resources.conftest import py

DEMO = Path(__file__).resolve().parents[2] / "config" / "jobs" / "ctr-demo.yaml"
HYBRID = "12:cpu,cpuacct:/user.slice/session-3\n4:memory:/user.slice\n0::/user.slice/session-3\n"
HYBRID_MOUNTS = (
    "25 1 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755\n"
    "35 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:15 - cgroup cgroup rw,cpu,cpuacct\n"
    "36 25 0:31 / /sys/fs/cgroup/memory rw,nosuid shared:16 - cgroup cgroup rw,memory\n"
    "37 25 0:32 / /sys/fs/cgroup/unified rw,nosuid shared:17 - cgroup2 cgroup2 rw\n"
)


def test_the_v1_cpu_cgroup_is_found_from_proc():
    assert own_v1_cpu_cgroup(HYBRID, HYBRID_MOUNTS) == Path("/sys/fs/cgroup/cpu,cpuacct/user.slice/session-3")
    # a container: the hierarchy mounted from its own cgroup (mount root /docker/abc)
    inside = "5:cpu:/docker/abc/worker\n"
    mounts = "40 30 0:33 /docker/abc /sys/fs/cgroup/cpu ro,nosuid - cgroup cgroup rw,cpu\n"
    assert own_v1_cpu_cgroup(inside, mounts) == Path("/sys/fs/cgroup/cpu/worker")
    # cgroup v2 only, or a cpuset hierarchy that is not cpu: none
    assert own_v1_cpu_cgroup("0::/user.slice\n", "37 25 0:32 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n") is None
    assert (
        own_v1_cpu_cgroup("3:cpuset:/\n", "34 25 0:29 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n") is None
    )


def test_a_quota_in_a_stand_in_hierarchy(tmp_path):
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    group = CpuQuota.make(tmp_path, "primus-job/stream_executor-0", 0.15)
    assert group.path == tmp_path / "primus-job_stream_executor-0"  # one directory, named safely
    assert (group.path / "cpu.cfs_quota_us").read_text() == "15000" and group.quota_cores() == pytest.approx(0.15)
    (group.path / "cpu.cfs_period_us").write_text("50000\n")  # the period the group has is the unit
    group = CpuQuota.make(tmp_path, "primus-job/stream_executor-0", 0.5)  # reused: the quota rewritten
    assert (group.path / "cpu.cfs_quota_us").read_text() == "25000" and group.quota_cores() == pytest.approx(0.5)
    group = CpuQuota.make(tmp_path, "primus-job/stream_executor-0", 0.0001)
    assert (group.path / "cpu.cfs_quota_us").read_text() == "1000"  # the kernel's floor
    group.add(4242)
    assert (group.path / "cgroup.procs").read_text() == "4242"
    assert v1_cpu_parent("off") == (None, "PRIMUS_CGROUP=off: cgroup v1 CPU quotas off")


def _job(roles: dict) -> PrimusJob:
    doc = load_job(DEMO).model_dump(mode="json", exclude_none=True)
    doc["metadata"]["name"] = "quota"
    doc["spec"]["resources"] = {"backend": "local", "roles": roles}
    return PrimusJob.model_validate(doc)


def _wait(condition, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while not (got := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)
    return got


def _running(backend, role: str):
    rows = [r for r in backend.workers().get(role, []) if r.get("state") == "running" and r.get("pid")]
    return rows[0] if rows else None


BUSY = py("while True:\n    pass")


def test_a_fractional_worker_is_throttled_at_its_allotment(job_env, monkeypatch):
    monkeypatch.delenv("PRIMUS_CGROUP", raising=False)  # this machine as it is
    parent, why = v1_cpu_parent()
    job = _job(
        {
            "data_executor": {"replicas": 1},
            "trainer": {"cpu": 1, "command": py("import time; time.sleep(120)")},
            "stream_executor": {"replicas": 1, "cpu": 0.25, "memory": "1Gi", "command": BUSY},
        }
    )
    backend = backend_for(job)
    backend.submit()
    try:
        row = _wait(lambda: _running(backend, "stream_executor"), "the busy worker")
        trainer = _wait(lambda: _running(backend, "trainer"), "the trainer")
        assert trainer["cpu_quota"] == ""  # a whole core: pinned to it, no cgroup
        if parent is None:  # no writable cgroup v1 cpu controller here: pinning alone, and why
            assert row["cpu_quota"] == "" and why
            return
        group = CpuQuota(Path(row["cpu_quota"]))
        assert group.path.parent == parent and group.quota_cores() == pytest.approx(0.25)
        assert str(row["pid"]) in (group.path / "cgroup.procs").read_text().split()
        _wait(lambda: group.throttled().get("nr_throttled", 0) > 0, "the kernel to throttle the busy worker")

        backend.resize("stream_executor", cpu=0.5)  # what the scaler's BackendActuator calls
        moved = _wait(
            lambda: (r := _running(backend, "stream_executor")) and r["pid"] != row["pid"] and r,
            "the worker restarted with its new allotment",
        )
        assert moved["cpu_quota"] == str(group.path) and group.quota_cores() == pytest.approx(0.5)
        assert str(moved["pid"]) in (group.path / "cgroup.procs").read_text().split()
    finally:
        backend.stop()
    if parent is not None:
        _wait(lambda: not group.path.exists(), "the worker's cgroup removed once it stopped")
