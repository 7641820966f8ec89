"""The YARN backend on a real Hadoop MiniYARNCluster (tests/fixtures/hadoop.py: a ResourceManager and
two NodeManagers that launch containers as real processes through DefaultContainerExecutor).

Every worker is a real YARN application whose AM container runs our AM (registered with the RM over
Hadoop RPC) and the role's real command; the tests read what those commands wrote, kill their
processes with SIGKILL, and check allocations through the RM's and the NodeManagers' REST APIs.
The unit tests at the top need no server: request construction and the wire formats.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from primus_lib.resources import backend_for
from primus_lib.resources.base import ResourceError
from primus_lib.resources.yarn import YarnBackend, YarnClient
from primus_lib.resources.yarn.client import submission_context
from primus_lib.resources.yarn.ipc import (
    Token,
    _directives,
    _read_varint,
    decode_command,
    digest_values,
    pb,
    read_tokens,
    request_header,
    unpb,
)
from tests.fixtures.specs import demo_doc, load, write_spec
from tests.resources.conftest import py

MIB = 2**20

# A long-running worker: appends "<pid> <container> <PRIMUS_CPU> <PRIMUS_MEMORY> <n>" every 0.2 s.
WORKER = r"""
import os, time
path = os.path.join(OUT, os.environ["PRIMUS_ROLE"] + "-" + os.environ["PRIMUS_REPLICA_INDEX"] + ".log")
n = 0
while True:
    n += 1
    with open(path, "a") as f:
        f.write(f"{os.getpid()} {os.environ.get('CONTAINER_ID')} {os.environ['PRIMUS_CPU']} "
                f"{os.environ['PRIMUS_MEMORY']} {n}\n")
    time.sleep(0.2)
"""


def worker(out: Path) -> list[str]:
    return py(f"OUT = {str(out)!r}\n" + WORKER)


# -- unit tests: no server ----------------------------------------------------------------------
def test_submission_context_runs_our_am_with_the_command_as_a_base64_argument():
    command = ["python", "-c", 'print("quotes \\" and $dollars")']
    ctx = submission_context(
        "application_1_0001",
        "j-r-0",
        command,
        1.5,
        3 * 2**30,
        "ads",
        ["primus-job:j"],
        {"PRIMUS_ROLE": "r"},
        4,
        "/venv/bin/python",
        scheduler="rm:8030",
    )
    spec = ctx["am-container-spec"]
    am = spec["commands"]["command"].split(" ")
    assert am[:5] == ["/venv/bin/python", "-m", "primus_lib.resources.yarn.am", "--scheduler", "rm:8030"]
    assert am[5] == "--command" and am[7:] == ["1><LOG_DIR>/stdout", "2><LOG_DIR>/stderr"]
    assert decode_command(am[6]) == command  # no quote reaches the launch script
    env = {e["key"]: e["value"] for e in spec["environment"]["entry"]}
    assert env == {"PRIMUS_ROLE": "r"}  # nothing of the command in the environment
    assert ctx["resource"] == {"memory": 3072, "vCores": 2}
    assert ctx["max-app-attempts"] == 4 and ctx["queue"] == "ads" and ctx["application-type"] == "PRIMUS"
    assert ctx["application-tags"] == {"tag": ["primus-job:j"]}


def test_wire_formats():
    # the RPC header's callId and retryCount are sint32 (zigzag): the SASL call -33 is 65
    assert unpb(request_header(-33, -1, b"")) == {1: [2], 2: [0], 3: [65], 4: [b""], 5: [1]}
    assert unpb(request_header(7, 0, b"id")) == {1: [2], 2: [0], 3: [14], 4: [b"id"], 5: [0]}
    msg = pb((1, "host"), (2, -1), (5, 0.5), (3, b"\x00\xff"))
    fields = unpb(msg)
    assert fields[1] == [b"host"] and fields[2] == [2**64 - 1] and fields[3] == [b"\x00\xff"]
    assert struct.unpack("<f", fields[5][0])[0] == 0.5
    assert _read_varint(pb((1, 300)), 1) == (300, 3)
    # RFC 2831's example exchange (section 4)
    assert digest_values(
        "chris",
        "secret",
        "elwood.innosoft.com",
        "OA6MG9tEQGm2hh",
        "OA6MHXh6VqTrRk",
        "00000001",
        "imap/elwood.innosoft.com",
    ) == ("d388dad90d4bbd760a152321f2143af7", "ea40f60335c427b5527b84dbabcdfffd")
    assert _directives('realm="a,b",nonce="x\\"y",qop=auth')["nonce"] == 'x"y'
    assert _directives('realm="a,b",nonce="x",qop=auth')["realm"] == "a,b"


def test_token_files_in_both_formats():
    def text(b: bytes) -> bytes:  # Hadoop Text: a vint length (< 128 here) + bytes
        return bytes([len(b)]) + b

    token = text(b"ident") + text(b"pw") + text(b"YARN_AM_RM_TOKEN") + text(b"")
    writable = b"HDTS\x00\x01" + text(b"alias") + token + b"\x00"
    tp = pb((1, b"ident"), (2, b"pw"), (3, "YARN_AM_RM_TOKEN"), (4, ""))
    creds = pb((1, pb((1, "alias"), (2, tp))))
    protobuf = b"HDTS\x01" + bytes([len(creds)]) + creds
    for data in (writable, protobuf):
        assert read_tokens(data) == [Token(b"ident", b"pw", "YARN_AM_RM_TOKEN", "")]
    with pytest.raises(Exception, match="HDTS"):
        read_tokens(b"nope")


def test_a_yarn_job_needs_a_resource_manager(job_env):
    job = load(demo_doc(roles={"trainer": {"command": ["x"]}}, backend="yarn"), check=False)
    with pytest.raises(ResourceError, match="resource_manager"):
        backend_for(job)
    with pytest.raises(ResourceError, match="resource_manager"):
        YarnBackend(job)


# -- the real cluster -----------------------------------------------------------------------------
def yarn_job(tmp_path: Path, rm_url: str, roles: dict) -> tuple[YarnBackend, str]:
    """A job of our own roles on the test cluster, its spec written to disk (workers read {SPEC}).
    It passes `primus validate` (a real primus command reads it): every role names an image (unused by
    this backend) and data_executor exists (no command: Airflow mapped tasks, not run by any backend)."""
    roles = {"data_executor": {"replicas": 1}, **roles}
    roles = {name: {"image": "primus-trainer:latest", **spec} for name, spec in roles.items()}
    clusters = [{"name": "mini", "backend": "yarn", "resource_manager": rm_url}]
    doc = demo_doc(roles=roles, backend="yarn", name=f"yarn-{uuid.uuid4().hex[:8]}", resources={"clusters": clusters})
    job = load(doc, check=False)
    spec = write_spec(tmp_path / "job.yaml", job)
    return YarnBackend(job, str(spec)), str(spec)


def wait_for(predicate, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.count(" ") == 4] if path.exists() else []


def writing(path: Path, container: str | None = None) -> list[str] | None:
    """The last line of a worker's log once it wrote at least twice (from ``container`` if given)."""
    rows = [r for r in lines(path) if container is None or r[1] == container]
    return rows[-1] if len(rows) >= 2 else None


def alive(pids) -> list[int]:
    """The processes among ``pids`` still running (a zombie awaiting its parent counts as gone)."""
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def container_env(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


@pytest.fixture
def rm(yarn_cluster) -> YarnClient:
    return YarnClient(yarn_cluster.rm_url)


def test_roles_run_as_real_containers_in_start_order_and_the_job_succeeds(yarn_cluster, rm, job_env, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    trainer = f"""
import json, os, pathlib, sys, time, urllib.request
out = pathlib.Path({str(out)!r})
executors = sorted(p.name for p in out.glob("stream_executor-*.log"))  # they run before this wave starts
apps = {yarn_cluster.rm_url!r} + "/ws/v1/cluster/apps?applicationTags=primus-job:" + os.environ["PRIMUS_JOB"]

def datagen():  # datagen runs alongside the executors: wait until its application SUCCEEDED
    found = json.load(urllib.request.urlopen(apps))["apps"]["app"]
    return [a["finalStatus"] for a in found if "primus-role:datagen" in a["applicationTags"]]

deadline = time.time() + 60
while "SUCCEEDED" not in datagen() and time.time() < deadline:
    time.sleep(0.3)
data = list((out / "data").rglob("_SUCCESS"))
(out / "trainer.txt").write_text(json.dumps([executors, len(data), os.environ["CONTAINER_ID"], datagen()]))
sys.exit(0 if len(executors) == 2 and len(data) == 4 else 3)
"""
    backend, spec = yarn_job(
        tmp_path,
        yarn_cluster.rm_url,
        {
            "stream_executor": {"replicas": 2, "cpu": 1, "memory": "128Mi", "command": worker(out)},
            # a real primus command: synthetic CTR partitions for two hours, then exit 0
            "datagen": {
                "replicas": 1,
                "memory": "512Mi",
                "command": [
                    sys.executable,
                    "-m",
                    "primus_lib.cli.main",
                    "datagen",
                    "{SPEC}",
                    "--start",
                    "2026-11-01T00:00:00Z",
                    "--end",
                    "2026-11-01T02:00:00Z",
                    "--rows-per-hour",
                    "40",
                    "--out",
                    str(out / "data"),
                ],
            },
            "trainer": {
                "replicas": 1,
                "memory": "128Mi",
                "command": py(trainer),
                "max_restarts": 0,
                "start_after": ["stream_executor", "datagen"],
            },
        },
    )
    assert backend.status().phase == "Stopped"
    try:
        started = time.monotonic()
        status = backend.submit()  # waits for each wave to run before the next
        assert status.phase in ("Running", "Succeeded"), status
        done = wait_for(lambda: (s := backend.ensure_running()).phase == "Succeeded" and s, 120, "the trainer")
        print(f"\nYARN job of 4 workers in 2 waves: Succeeded {time.monotonic() - started:.1f}s after submit")
        # the trainer ran after both executors wrote and the real datagen finished its partitions
        executors, partitions, container, datagen = json.loads((out / "trainer.txt").read_text())
        assert executors == ["stream_executor-0.log", "stream_executor-1.log"] and partitions == 4
        assert datagen == ["SUCCEEDED"]
        assert (out / "data" / "impressions" / "20261101" / "01" / "part-00000.parquet").exists()
        assert done.roles["trainer"].succeeded == 1 and done.roles["datagen"].succeeded == 1
        apps = {a["name"]: a for a in rm.apps(f"primus-job:{backend.job.name}")}
        assert apps[f"{backend.job.name}-trainer-0"]["finalStatus"] == "SUCCEEDED"
        assert container.startswith("container_")
        # every executor wrote from the AM container the RM reports for its application
        rows = backend.workers("stream_executor")["stream_executor"]
        for row in rows:
            assert {r[1] for r in lines(out / f"stream_executor-{row['index']}.log")} == {row["container"]}
        # the success policy stopped the never-ending executors
        assert all(apps[f"{backend.job.name}-stream_executor-{i}"]["state"] == "KILLED" for i in (0, 1))
        pids = {int(r[0]) for i in (0, 1) for r in lines(out / f"stream_executor-{i}.log")}
        # the RM says KILLED when it asks; the NodeManager signals the container a moment later
        wait_for(lambda: not alive(pids), 30, "the killed executors' processes to exit")
        # another process reattaches: same status, nothing resubmitted
        again = YarnBackend(backend.job, spec)
        assert again.ensure_running().phase == "Succeeded"
        assert len(rm.apps(f"primus-job:{backend.job.name}")) == 4
    finally:
        backend.stop()


def test_killed_workers_come_back_and_are_counted(yarn_cluster, rm, job_env, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    backend, _ = yarn_job(
        tmp_path,
        yarn_cluster.rm_url,
        {
            "stream_executor": {"replicas": 1, "memory": "128Mi", "command": worker(out), "max_restarts": 3},
        },
    )
    log = out / "stream_executor-0.log"
    try:
        started = time.monotonic()
        assert backend.submit().roles["stream_executor"].running == 1
        first = wait_for(lambda: writing(log), 30, "the worker to write")
        print(f"\nYARN worker RUNNING and writing {time.monotonic() - started:.1f}s after submit")
        pid, container = int(first[0]), first[1]
        assert container_env(pid)["CONTAINER_ID"] == container  # the real process in that container
        assert backend.workers()["stream_executor"][0]["container"] == container

        # 1) SIGKILL the role's process: the AM fails the attempt, the RM starts attempt 2
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        row = wait_for(lambda: next((r for r in lines(log)[-1:] if r[1] != container), None), 60, "attempt 2")
        print(f"YARN restart after kill -9 (new attempt writing): {time.monotonic() - killed:.1f}s")
        status = wait_for(lambda: (s := backend.status().roles["stream_executor"]).running == 1 and s, 30, "RUNNING")
        assert status.restarts == 1 and row[1].split("_")[-2] == "02"  # container_<ts>_<app>_<attempt>_<n>
        assert not alive([pid])

        # 2) FORCEFUL_SHUTDOWN of the AM container through the RM's REST API
        cap = int(rm.conf("yarn.resourcemanager.am.max-attempts") or 2)
        second = row[1]
        signalled = time.monotonic()
        rm.signal_container(second, "FORCEFUL_SHUTDOWN")
        app_id = backend.workers()["stream_executor"][0]["app"]
        wait_for(lambda: lines(log)[-1][1] != second or rm.app(app_id)["state"] == "FAILED", 60, "the kill")
        if cap <= 2:  # the RM's attempt cap is reached: the app FAILED, the backend resubmits the worker
            pending = wait_for(lambda: (s := backend.status()).roles["stream_executor"].note and s, 30, "FAILED")
            assert (
                pending.phase in ("Pending", "Running") and "restart pending" in pending.roles["stream_executor"].note
            )
            backend.ensure_running()
        wait_for(lambda: (r := lines(log)[-1])[1] not in (container, second) and writing(log, r[1]), 60, "restart 2")
        print(f"YARN restart after FORCEFUL_SHUTDOWN (cap {cap}): {time.monotonic() - signalled:.1f}s")
        status = backend.status()
        assert status.phase == "Running" and status.roles["stream_executor"].running == 1
        assert status.roles["stream_executor"].restarts == 2
    finally:
        backend.stop()


def test_scale_resize_and_stop(yarn_cluster, rm, job_env, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    backend, _ = yarn_job(
        tmp_path,
        yarn_cluster.rm_url,
        {
            "stream_executor": {
                "replicas": 1,
                "min_replicas": 1,
                "max_replicas": 3,
                "cpu": 1,
                "memory": "128Mi",
                "command": worker(out),
            },
        },
    )
    role = "stream_executor"
    try:
        backend.submit()
        t = time.monotonic()
        backend.scale(role, 5)  # clamped to max_replicas
        wait_for(lambda: backend.status().roles[role].running == 3, 60, "3 workers")
        wait_for(lambda: all(writing(out / f"{role}-{i}.log") for i in range(3)), 30, "3 workers writing")
        print(f"\nYARN scale 1 -> 3 (all RUNNING and writing): {time.monotonic() - t:.1f}s")
        assert backend.status().roles[role].desired == 3
        gone = [int(lines(out / f"{role}-{i}.log")[-1][0]) for i in (1, 2)]
        t = time.monotonic()
        backend.scale(role, 1)
        wait_for(lambda: backend.status().roles[role].running == 1, 60, "1 worker")
        wait_for(lambda: not any(psutil.pid_exists(p) for p in gone), 30, "the scaled-down processes to end")
        print(f"YARN scale 3 -> 1 (processes gone): {time.monotonic() - t:.1f}s")
        states = ["RUNNING", "KILLED", "KILLED"]
        wait_for(lambda: [r["state"] for r in backend.workers()[role]] == states, 30, "the KILLED applications")

        t = time.monotonic()
        backend.resize(role, cpu=2, memory=256 * MIB)
        row = wait_for(lambda: (w := backend.workers()[role][0])["state"] == "RUNNING" and w, 60, "the resize")
        last = wait_for(lambda: writing(out / f"{role}-0.log", row["container"]), 30, "the resized worker")
        print(f"YARN resize (kill + resubmit, RUNNING and writing): {time.monotonic() - t:.1f}s")
        assert (float(last[2]), int(last[3])) == (2.0, 256 * MIB)  # PRIMUS_CPU / PRIMUS_MEMORY it sees
        assert (row["allocated_mb"], row["allocated_vcores"]) == (256, 2)  # the RM's application report
        containers = rm.attempt_containers(row["app"], row["attempt"])
        am = next(c for c in containers if c["containerId"] == row["container"])
        assert (am["allocatedMB"], am["allocatedVCores"]) == (256, 2)  # the RM's container report
        nm = rm.node_container(row["node_http"], row["container"])
        assert (nm["totalMemoryNeededMB"], nm["totalVCoresNeeded"], nm["state"]) == (256, 2, "RUNNING")
        status = backend.status().roles[role]
        assert (status.cpu, status.memory, status.running, status.desired) == (2.0, 256 * MIB, 1, 1)

        backend.stop()
        assert backend.status().phase == "Stopped"
        assert all(a["state"] == "KILLED" for a in rm.apps(f"primus-job:{backend.job.name}"))
    finally:
        backend.stop()


def test_a_critical_role_failing_for_good_fails_the_job_and_stops_the_rest(yarn_cluster, rm, job_env, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    backend, _ = yarn_job(
        tmp_path,
        yarn_cluster.rm_url,
        {
            "stream_executor": {"replicas": 1, "memory": "128Mi", "command": worker(out)},
            "trainer": {
                "replicas": 1,
                "memory": "128Mi",
                "max_restarts": 0,
                "start_after": ["stream_executor"],
                "command": py("import sys; print('bad input', file=sys.stderr); sys.exit(7)"),
            },
        },
    )
    try:
        status = backend.submit()
        status = wait_for(lambda: (s := backend.ensure_running()).phase == "Failed" and s, 60, "the failure")
        assert "trainer" in status.message and "exit code 7" in status.roles["trainer"].note
        assert status.roles["trainer"].failed == 1 and status.roles["trainer"].restarts == 0
        apps = rm.apps(f"primus-job:{backend.job.name}")
        assert sorted(a["state"] for a in apps) == ["FAILED", "KILLED"]  # the executor was stopped
    finally:
        backend.stop()


def test_our_am_keeps_its_application_alive_past_the_liveness_expiry(yarn_cluster, rm, job_env, tmp_path):
    """An AM container that never registers leaves its application ACCEPTED and is expired after
    yarn.am.liveness-monitor.expiry-interval-ms; ours registers and heartbeats."""
    out = tmp_path / "out"
    out.mkdir()
    backend, _ = yarn_job(
        tmp_path,
        yarn_cluster.rm_url,
        {
            "stream_executor": {"replicas": 1, "memory": "128Mi", "command": worker(out), "max_restarts": 0},
        },
    )
    raw = rm.new_application()["application-id"]
    ctx = submission_context(
        raw, "no-am", ["sleep", "600"], 1, 64 * MIB, "default", ["primus-test:raw"], {}, 1, sys.executable
    )
    ctx["am-container-spec"]["commands"]["command"] = "sleep 600"  # runs, never registers
    try:
        rm.submit(ctx)
        backend.submit()
        expiry = int(rm.conf("yarn.am.liveness-monitor.expiry-interval-ms") or 600000) / 1000
        app = backend.workers()["stream_executor"][0]
        wait_for(lambda: rm.attempts(raw) and rm.attempts(raw)[0].get("containerId"), 30, "the raw AM container")
        assert rm.app(raw)["state"] == "ACCEPTED" and app["state"] == "RUNNING"
        if expiry <= 60:  # the fixture's short expiry: watch the RM expire the silent AM
            failed = wait_for(lambda: rm.app(raw)["state"] == "FAILED" and rm.app(raw), expiry * 3 + 15, "expiry")
            assert "timed out" in failed["diagnostics"] or "expired" in failed["diagnostics"].lower()
            worker_app = rm.app(app["app"])
            assert worker_app["state"] == "RUNNING" and worker_app["elapsedTime"] > expiry * 1000
            assert len(rm.attempts(app["app"])) == 1
    finally:
        if rm.app(raw)["state"] not in ("FAILED", "KILLED", "FINISHED"):
            rm.kill(raw)
        backend.stop()


def test_idleness_and_errors_come_from_the_rm(yarn_cluster, rm, job_env, tmp_path):
    backend, _ = yarn_job(tmp_path, yarn_cluster.rm_url, {"trainer": {"command": ["true"]}})
    share, cores, memory, total = backend.idleness()
    metrics = rm.metrics()
    assert total == metrics["totalVirtualCores"] > 0 and 0 <= share <= 1
    assert memory <= metrics["totalMB"] * MIB
    with pytest.raises(ResourceError, match="404|400"):
        rm.kill("application_1_999999")


def test_the_am_takes_the_scheduler_and_the_command_as_arguments_only(monkeypatch):
    from primus_lib.resources.yarn.am import parse_args
    from primus_lib.resources.yarn.ipc import encode_command

    command = ["python", "-c", 'print("$HOME")']
    monkeypatch.setenv("PRIMUS_YARN_COMMAND", encode_command(["never", "read"]))
    assert parse_args(["--scheduler", "rm:8030", "--command", encode_command(command)]) == ("rm:8030", command)
    assert parse_args(["--scheduler", "rm:8030", "--", "sleep", "1"]) == ("rm:8030", ["sleep", "1"])
    assert parse_args([]) == ("", [])  # main() answers with the usage line and exit 2
    with pytest.raises(SystemExit, match="unexpected argument '--bogus'"):
        parse_args(["--bogus"])
