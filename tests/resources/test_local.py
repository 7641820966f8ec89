"""The local backend: real processes, real restarts, psutil accounting, a process table others reattach to."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from primus_lib.resources import backend_for, ensure_running
from primus_lib.resources.local import LocalBackend
from primus_lib.resources.table import alive, read_json
from tests.fixtures.specs import demo_doc, load, write_spec
from tests.resources.conftest import py

SLEEP = py("import time; time.sleep(120)")


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def pids(backend: LocalBackend, role: str) -> list[int]:
    return sorted(w["pid"] for w in backend.workers().get(role, []) if w["state"] == "running" and alive(w))


@pytest.fixture
def started(job_env):
    backends = []

    def start(roles: dict) -> LocalBackend:
        backend = backend_for(load(demo_doc(roles=roles), check=False))
        backends.append(backend)
        backend.submit()
        return backend

    yield start
    for backend in backends:
        backend.stop()


def test_start_order_and_reattach_without_duplicates(started, job_env):
    backend = started(
        {
            "data_executor": {"replicas": 1},
            "stream_executor": {"replicas": 2, "max_replicas": 4, "command": SLEEP},
            "trainer": {"command": SLEEP, "start_after": ["stream_executor"]},
        }
    )
    wait_for(lambda: len(pids(backend, "stream_executor")) == 2 and len(pids(backend, "trainer")) == 1, what="workers")
    rows = backend.workers()
    first_trainer = min(w["create_time"] for w in rows["trainer"])
    assert first_trainer >= max(w["create_time"] for w in rows["stream_executor"])
    status = backend.status()
    assert status.phase == "Running"
    assert status.roles["data_executor"].note.startswith("not started locally")
    # another process (an Airflow task, the CLI) reattaches through the table: nothing new starts
    code = (
        "import json; from primus_lib.resources import ensure_running; from primus_lib.spec import PrimusJob;"
        "import sys; job = PrimusJob.model_validate(json.load(open(sys.argv[1])));"
        "print(ensure_running(job).phase)"
    )
    job_file = job_env / "job.json"
    job_file.write_text(json.dumps(backend.job.model_dump(mode="json")))
    out = subprocess.run(
        [sys.executable, "-c", code, str(job_file)], capture_output=True, text=True, env=os.environ, check=True
    )
    assert out.stdout.strip() == "Running"
    before = (
        read_json(backend.dir / "supervisor.json")["pid"],
        pids(backend, "stream_executor"),
        pids(backend, "trainer"),
    )
    ensure_running(backend.job)
    after = (
        read_json(backend.dir / "supervisor.json")["pid"],
        pids(backend, "stream_executor"),
        pids(backend, "trainer"),
    )
    assert before == after


def test_failed_worker_restarts_then_runs(started, job_env):
    marker = job_env / "crashed-once"
    flaky = py(
        f"import os, sys, time\nif not os.path.exists({str(marker)!r}):\n open({str(marker)!r}, 'w').close(); sys.exit(1)\ntime.sleep(120)"
    )
    backend = started({"data_executor": {"replicas": 1}, "trainer": {"command": flaky, "max_restarts": 2}})
    wait_for(lambda: backend.status().roles["trainer"].restarts == 1 and pids(backend, "trainer"), what="a restart")
    assert backend.status().phase == "Running"


def test_critical_role_failing_for_good_fails_the_job(started):
    backend = started(
        {
            "data_executor": {"replicas": 1},
            "stream_executor": {"replicas": 1, "command": SLEEP},
            "side": {"replicas": 1, "command": py("raise SystemExit(4)"), "max_restarts": 0},
            "trainer": {"command": py("raise SystemExit(3)"), "max_restarts": 2},
        }
    )
    status = wait_for(lambda: (s := backend.status()).phase == "Failed" and s, what="job failure")
    assert status.roles["trainer"].restarts == 2 and status.roles["trainer"].failed == 1
    assert status.roles["side"].failed == 1  # not critical: it alone would not fail the job
    assert "critical role 'trainer'" in status.message
    wait_for(lambda: not alive(read_json(backend.dir / "supervisor.json")), what="supervisor exit")
    assert pids(backend, "stream_executor") == []


def test_success_policy_stops_the_other_roles(started):
    backend = started(
        {
            "data_executor": {"replicas": 1},
            "stream_executor": {"replicas": 1, "command": SLEEP},
            "trainer": {"command": py("import time; time.sleep(0.5)"), "start_after": ["stream_executor"]},
        }
    )
    status = wait_for(lambda: (s := backend.status()).phase == "Succeeded" and s, what="success")
    assert status.roles["trainer"].succeeded == 1
    wait_for(lambda: pids(backend, "stream_executor") == [], what="stream executors stopped")


def test_scale_resize_and_oom_kill(started):
    hog = py("import time; x = bytearray(300 * 2**20); time.sleep(120)")
    env_dump = py("import os, time; print('MEM', os.environ['PRIMUS_MEMORY'], flush=True); time.sleep(120)")
    backend = started(
        {
            "data_executor": {"replicas": 1},
            "stream_executor": {
                "replicas": 2,
                "min_replicas": 1,
                "max_replicas": 4,
                "command": env_dump,
                "memory": "1Gi",
            },
            "hog": {"replicas": 1, "command": hog, "memory": "100Mi", "max_restarts": 1},
            "trainer": {"command": SLEEP},
        }
    )
    wait_for(lambda: len(pids(backend, "stream_executor")) == 2, what="2 stream executors")
    backend.scale("stream_executor", 3)
    wait_for(lambda: len(pids(backend, "stream_executor")) == 3, what="scale up to 3")
    backend.scale("stream_executor", 1)
    wait_for(lambda: len(pids(backend, "stream_executor")) == 1, what="scale down to 1")
    old = pids(backend, "stream_executor")
    backend.resize("stream_executor", cpu=1, memory=512 * 2**20)
    wait_for(lambda: pids(backend, "stream_executor") not in ([], old), what="rolling restart")
    assert backend.status().roles["stream_executor"].memory == 512 * 2**20
    log = backend.dir / "logs" / "stream_executor-0.log"
    wait_for(lambda: f"MEM {512 * 2**20}" in log.read_text(), what="the new limit in the worker's env")
    # the hog's RSS passes its 100Mi limit: the supervisor kills it like a cgroup OOM kill
    hog_rows = wait_for(lambda: [w for w in backend.workers()["hog"] if w["oom_kills"] >= 1], what="OOM kill")
    assert hog_rows[0]["restarts"] >= 1
    # ... and exported for the vertical policy (a killed worker cannot report its own OOM kill)
    from primus_lib.metrics.names import OOM_KILLS
    from primus_lib.metrics.readers import TextfileReader
    from primus_lib.paths import JobPaths

    reader = TextfileReader(backend.job.name, JobPaths.for_job(backend.job).metrics_dir, role="hog")
    wait_for(lambda: sum(reader._values(OOM_KILLS, "hog")) >= 1, what="OOM kills in the metrics dir")


def test_lost_supervisor_is_replaced_and_orphans_ended(started):
    backend = started({"data_executor": {"replicas": 1}, "trainer": {"command": SLEEP}})
    wait_for(lambda: pids(backend, "trainer"), what="trainer")
    orphan = pids(backend, "trainer")[0]
    supervisor = read_json(backend.dir / "supervisor.json")["pid"]
    os.kill(supervisor, signal.SIGKILL)  # the supervisor this test started (by PID)
    wait_for(lambda: backend.status().phase == "Stopped", what="lost supervisor noticed")
    backend.ensure_running()
    assert read_json(backend.dir / "supervisor.json")["pid"] != supervisor
    wait_for(
        lambda: not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE,
        what="orphan ended",
    )
    wait_for(lambda: len(pids(backend, "trainer")) == 1, what="one new trainer")


def test_stop_ends_every_process(started):
    backend = started(
        {
            "data_executor": {"replicas": 1},
            "stream_executor": {"replicas": 2, "command": SLEEP},
            "trainer": {"command": SLEEP},
        }
    )
    wait_for(lambda: len(pids(backend, "stream_executor")) == 2, what="workers")
    every = pids(backend, "stream_executor") + pids(backend, "trainer")
    backend.stop()
    assert backend.status().phase == "Stopped"
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in every)


def test_cli_start_status_scale_stop(job_env):

    roles = {"data_executor": {"replicas": 1}, "trainer": {"command": SLEEP, "max_replicas": 2}}
    job = load(demo_doc(roles=roles), check=False)
    spec = write_spec(job_env / "job.yaml", job)

    def primus(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "primus_lib.cli.main", "resources", *args, str(spec)],
            capture_output=True,
            text=True,
            env=os.environ,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        assert json.loads(primus("start"))["phase"] == "Running"
        primus("scale", "--role", "trainer", "--replicas", "2")
        backend = LocalBackend(job, str(spec))
        wait_for(lambda: len(pids(backend, "trainer")) == 2, what="2 trainers via the CLI")
        assert json.loads(primus("status"))["roles"]["trainer"]["running"] == 2
    finally:
        primus("stop")
    assert json.loads(primus("status"))["phase"] == "Stopped"


def test_supervisor_that_crashes_ends_its_workers(job_env):
    """An unexpected error in the supervisor's loop stops the workers it started before it dies."""
    from primus_lib.resources.supervisor import Supervisor
    from primus_lib.resources.table import resources_dir, write_json

    job = load(demo_doc(roles={"data_executor": {"replicas": 1}, "trainer": {"command": SLEEP}}), check=False)
    directory = resources_dir(job)
    write_json(directory / "job.json", job.model_dump(mode="json"))
    write_json(directory / "desired.json", {"spec_path": None, "stop": False, "roles": {}})
    supervisor = Supervisor(directory)
    workers: list[psutil.Process] = []

    def broken() -> None:
        workers.extend(psutil.Process(w.proc.pid) for r in supervisor.roles.values() for w in r.workers.values())
        raise RuntimeError("boom")

    supervisor.check_success = broken
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(RuntimeError, match="boom"):
            supervisor.run()
    finally:  # run() installs its own handlers in this (the test) process
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert workers
    for proc in workers:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
