"""primus_lib.resources.limits: thread counts and memory caps in a process, cgroup v2 detection, and
the local backend's workers getting new limits when resized."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from primus_lib.resources import cgroup, limits, proctree
from primus_lib.resources.limits import Limits, enforced
from tests.fixtures.specs import demo_doc, load
from tests.resources.conftest import py

MIB = 2**20


@pytest.fixture(autouse=True)
def no_cgroups(monkeypatch):
    monkeypatch.setenv("PRIMUS_CGROUP", "off")  # the RSS guard unless a test sets a stand-in hierarchy
    # the hard cap kills the process: keep it far from pytest's (a subprocess test checks the real one)
    monkeypatch.setattr(limits, "MEMORY_HARD_FACTOR", 4.0)
    monkeypatch.setattr(proctree, "descendants", lambda pid: [])  # pytest's servers are not a task's children


def hold(size: int, seconds: float = 2.0) -> None:
    """Allocate and touch ``size`` bytes, held in Python-level sleeps (where the guard's signal lands)."""
    held = bytearray(b"\x01") * size
    for _ in range(int(seconds / 0.05)):
        time.sleep(0.05)
    del held


def fake_cgroup(root, controllers="cpu io memory pids", subtree="cpu memory"):
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text(subtree + "\n")
    return root


def test_threads_follow_the_allotment_and_are_restored():
    before = (pa.cpu_count(), pa.io_thread_count(), os.environ.get("OMP_NUM_THREADS"))
    with enforced(Limits(2.5, 4 << 30), "task a") as applied:
        assert applied.threads == 3 and applied.memory == "rss guard"
        assert (pa.cpu_count(), pa.io_thread_count(), os.environ["OMP_NUM_THREADS"]) == (3, 3, "3")
        assert limits.active() is applied
    assert (pa.cpu_count(), pa.io_thread_count(), os.environ.get("OMP_NUM_THREADS")) == before
    assert limits.active() is None
    assert Limits(0.1, 1).threads == 1 and Limits(4.0, 1).threads == 4


UNDER_AND_OVER = """
from primus_lib.resources import limits
from primus_lib.resources.limits import Limits, MemoryCapExceeded, enforced
limits.MEMORY_HARD_FACTOR = 4.0  # the soft cap's error is under test, not the hard cap's kill
from tests.resources.test_limits import MIB, hold
with enforced(Limits(1, 200 * MIB), "data task ok"):
    hold(32 * MIB, 0.3)
try:
    with enforced(Limits(1, 64 * MIB), "data task big"):
        hold(96 * MIB)
except MemoryCapExceeded as exc:
    assert limits.active() is None
    print("raised:", exc)
"""


def test_under_the_cap_passes_over_it_fails_naming_the_task():
    """In its own process: the guard measures the whole process, and pytest's carries other tests'
    threads and servers (a CI run once saw pytest's own RSS grow past the hard cap here, and die)."""
    done = subprocess.run(py(UNDER_AND_OVER), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "raised: data task big: executor memory cap 64.0 MiB exceeded (RSS " in done.stdout, done.stdout


BESIDE_A_SERVER = """
import os, subprocess, sys, time
os.environ["PRIMUS_CGROUP"] = "off"
from primus_lib.resources import limits, proctree
from primus_lib.resources.limits import Limits, enforced
limits.MEMORY_HARD_FACTOR = 4.0
walks, descendants = [0], proctree.descendants
def counted(pid):  # the guard lists the children it measures with this: count its walks
    walks[0] += 1
    return descendants(pid)
proctree.descendants = counted
code = ("import sys; sys.stdin.readline(); x = bytearray(b'1') * (200 * 2**20); "
        "print('allocated', flush=True); sys.stdin.readline()")
elder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
try:
    with enforced(Limits(1, 64 * 2**20), "data task beside a server"):
        held = bytearray(b"1") * (8 * 2**20)
        elder.stdin.write("go\\n")
        elder.stdin.flush()
        assert elder.stdout.readline() == "allocated\\n"  # the elder grew by 200 MiB inside the block
        seen, deadline = walks[0], time.monotonic() + 120
        while walks[0] < seen + 2:  # a whole walk of the children (and its cap check) since then
            assert time.monotonic() < deadline, "the guard never measured the children"
            time.sleep(0.05)
finally:
    elder.kill()
    elder.wait()
print("beside ok")
"""


def test_a_child_started_before_the_block_is_not_the_tasks():
    """A server the process started earlier (a test session's broker, an executor's sidecar) grows
    as it likes; only what the block itself adds counts against the task's cap. In its own
    process, as the nested test below."""
    done = subprocess.run(py(BESIDE_A_SERVER), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "beside ok" in done.stdout, done.stdout + done.stderr


SWALLOWED = """
from primus_lib.resources import limits
from primus_lib.resources.limits import Limits, MemoryCapExceeded, enforced
limits.MEMORY_HARD_FACTOR = 4.0  # the soft cap's signal is under test, not the hard cap's kill
from tests.resources.test_limits import MIB, hold
try:
    with enforced(Limits(1, 64 * MIB), "data task sly"):
        try:
            hold(96 * MIB)
        except Exception:  # what careless task code does
            pass
except MemoryCapExceeded as exc:
    print("raised:", exc)
"""


def test_a_task_that_swallows_the_signal_still_fails():
    """In its own process: the RSS a long test session freed just before the block (and the
    allocator keeps) would otherwise hide the block's growth."""
    done = subprocess.run(py(SWALLOWED), capture_output=True, text=True, timeout=120)
    assert "raised: data task sly: executor memory cap 64.0 MiB exceeded" in done.stdout, done.stdout + done.stderr


NESTED = """
import os, threading, time
os.environ["PRIMUS_CGROUP"] = "off"
import pyarrow as pa
from primus_lib.resources import limits
from primus_lib.resources.limits import Limits, MemoryCapExceeded, enforced
limits.MEMORY_HARD_FACTOR = 4.0
MIB = 2**20
errors = {}

def hold(size, seconds):
    held = bytearray(b"\\x01") * size
    for _ in range(int(seconds / 0.05)):
        time.sleep(0.05)
    del held

def runner(name, size):
    try:
        with enforced(Limits(8, 10 << 30), name) as joined:  # other limits: the outer ones stay
            assert joined.threads == 2
            hold(size, 1.0 if size else 0.2)
        errors[name] = None
    except BaseException as exc:
        errors[name] = exc

with enforced(Limits(2, 64 * MIB), "executor e1", watch=False):
    assert pa.cpu_count() == 2
    for name, size in (("task small", 0), ("task big", 96 * MIB)):
        thread = threading.Thread(target=runner, args=(name, size))
        thread.start()
        thread.join()
    assert pa.cpu_count() == 2 and limits.active() is not None
assert errors["task small"] is None, errors["task small"]
assert isinstance(errors["task big"], MemoryCapExceeded) and str(errors["task big"]).startswith("task big: ")
assert limits.active() is None
print("nested ok")
"""


def test_nested_blocks_join_the_outermost_and_each_runner_is_watched():
    """A BatchExecutor holds the executor's limits (watch=False); each runner thread's task joins
    them. In its own process: the guard reads the whole process's RSS, and pytest's process
    carries other tests' threads."""
    done = subprocess.run(py(NESTED), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "nested ok" in done.stdout, done.stdout + done.stderr


def test_past_the_hard_cap_the_process_is_killed():
    code = (
        "import os, time; os.environ['PRIMUS_CGROUP'] = 'off'\n"
        "from primus_lib.resources.limits import Limits, enforced\n"
        "with enforced(Limits(1, 32 * 2**20), 'data task runaway'):\n"
        "    x = bytearray(b'1') * (160 * 2**20)\n"
        "    time.sleep(10)\n"  # one C call: the soft signal cannot land, the hard cap kills
        "print('survived')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stdout + done.stderr
    assert "data task runaway: executor memory cap 40.0 MiB exceeded" in done.stderr and "killed" in done.stderr


# -- cgroup v2 -------------------------------------------------------------------------------
def test_cgroup_v2_detection(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_CGROUP", str(fake_cgroup(tmp_path / "a", subtree="")))
    parent, why = cgroup.cgroup_parent()
    assert parent == tmp_path / "a" and (tmp_path / "a" / "cgroup.subtree_control").read_text() == "+memory +cpu"
    monkeypatch.setenv("PRIMUS_CGROUP", str(fake_cgroup(tmp_path / "b", controllers="cpu pids")))
    parent, why = cgroup.cgroup_parent()
    assert parent is None and "no memory controller" in why
    blocked = fake_cgroup(tmp_path / "c", subtree="")
    (blocked / "cgroup.subtree_control").unlink()
    (blocked / "cgroup.subtree_control").mkdir()  # unreadable as a file: as if not allowed
    monkeypatch.setenv("PRIMUS_CGROUP", str(blocked))
    assert cgroup.cgroup_parent()[0] is None
    monkeypatch.setenv("PRIMUS_CGROUP", "off")
    assert cgroup.cgroup_parent() == (None, "disabled by PRIMUS_CGROUP=off")
    monkeypatch.delenv("PRIMUS_CGROUP")
    parent, why = cgroup.cgroup_parent()  # this machine, whatever it has (docs/scaling.md says what ran here)
    assert why


def test_a_task_in_its_own_cgroup(tmp_path, monkeypatch):
    own = fake_cgroup(tmp_path / "own")
    monkeypatch.setenv("PRIMUS_CGROUP", str(own))
    with enforced(Limits(1.5, 512 * MIB), "data task x/1") as applied:
        group = applied.cgroup.path
        assert applied.memory == "cgroup v2" and group.parent == own and "data_task_x_1" in group.name
        assert (group / "memory.high").read_text() == str(512 * MIB)
        assert (group / "memory.max").read_text() == str(int(512 * MIB * limits.MEMORY_HARD_FACTOR))
        assert (group / "cpu.max").read_text() == "150000 100000"
        assert (group / "cgroup.procs").read_text() == str(os.getpid())
    assert (own / "cgroup.procs").read_text() == str(os.getpid())  # back in its own cgroup


def test_oom_kills_are_read_from_memory_events(tmp_path):
    own = fake_cgroup(tmp_path / "own")
    group = cgroup.Cgroup.make(own, "w", cpu=1, memory_max=MIB)
    assert group.oom_kills() == group.ooms_before == 0
    (group.path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert group.oom_kills() == 1
    assert cgroup.Cgroup.make(own, "w", cpu=1, memory_max=MIB).ooms_before == 1  # reused: counts from here


# -- the local backend: a resized worker gets the new limits ----------------------------------------
REPORT = py(
    "import os, time, pyarrow as pa\n"
    "print('LIMITS', os.environ['PRIMUS_CPU'], os.environ['PRIMUS_MEMORY'], os.environ['OMP_NUM_THREADS'],"
    " pa.cpu_count(), pa.io_thread_count(), len(os.sched_getaffinity(0)), flush=True)\n"
    "time.sleep(120)"
)


def test_a_resized_local_worker_gets_the_new_limits(job_env, tmp_path, monkeypatch):
    from primus_lib.resources import backend_for
    from primus_lib.resources.table import alive
    from tests.resources.test_local import wait_for

    own = fake_cgroup(tmp_path / "cgroup")  # inherited by the supervisor: its workers' cgroups go here
    monkeypatch.setenv("PRIMUS_CGROUP", str(own))
    roles = {
        "data_executor": {"replicas": 1},
        "trainer": {"command": py("import time; time.sleep(120)")},
        "stream_executor": {"replicas": 1, "command": REPORT, "cpu": 1, "memory": "1Gi"},
    }
    job = load(demo_doc(roles=roles), check=False)
    backend = backend_for(job)
    backend.submit()
    try:
        log = backend.dir / "logs" / "stream_executor-0.log"
        wait_for(lambda: log.exists() and "LIMITS" in log.read_text(), what="the first worker's report")
        assert f"LIMITS 1.0 {2**30} 1 1 1 1" in log.read_text()
        group = own / f"primus-{job.name}-stream_executor-0"
        assert (group / "memory.max").read_text() == str(2**30) and (group / "cpu.max").read_text() == "100000 100000"
        first = [w["pid"] for w in backend.workers()["stream_executor"] if alive(w)]

        backend.resize("stream_executor", cpu=2, memory=512 * MIB)  # what the scaler's BackendActuator calls
        new = f"LIMITS 2.0 {512 * MIB} 2 2 2 {min(2, len(os.sched_getaffinity(0)))}"
        wait_for(lambda: new in log.read_text(), what="the restarted worker's new limits")
        (row,) = backend.workers()["stream_executor"]
        assert row["pid"] not in first and row["cgroup"] == str(group)
        assert (group / "memory.max").read_text() == str(512 * MIB)
        assert (group / "cpu.max").read_text() == "200000 100000"
        assert (group / "cgroup.procs").read_text() == str(row["pid"])
        assert len(row["cores"]) == min(2, len(os.sched_getaffinity(0)))
    finally:
        backend.stop()
