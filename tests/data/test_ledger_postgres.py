"""The ledger and the training queue on PostgreSQL under concurrent writers: real processes, each
with its own engine and connections, released together by a gate file so their claims, plans and
appends collide. Plus the spec's ``storage.database`` end to end, and passwords kept out of
errors and reprs."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from primus_lib.data import db
from primus_lib.data.db import DatabaseError, dispose
from primus_lib.data.ledger import SUCCEEDED, TaskLedger
from primus_lib.data.task import DataTask
from primus_lib.data.training_queue import TrainingQueue
from tests.data.helpers import T0, write_layout
from tests.fixtures._proc import free_port
from tests.fixtures.specs import demo_doc

ROOT = Path(__file__).resolve().parents[2]
_SPAWNED: list[subprocess.Popen] = []

WORKER = r"""
import json, os, random, sys, time
mode, url, name, gate, arg = sys.argv[1:6]
arg = json.loads(arg)
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.task import DataTask
from primus_lib.data.training_queue import OutOfOrderWindow, TrainingQueue
ledger = TaskLedger(url, max_attempts=50, heartbeat_timeout=arg.get("timeout", 60))
queue = TrainingQueue(url)
open(gate + "." + name, "w").close()  # set up: engine, schema, imports
while not os.path.exists(gate):
    time.sleep(0.002)
events = []
rng = random.Random(name)
if mode == "claim":  # claim until nothing is left; fail a share of the attempts
    while True:
        task = ledger.claim(name)
        if task is None:
            counts = ledger.counts()
            if counts["pending"] == counts["running"] == 0:
                break
            ledger.reclaim_dead()  # a dead executor's tasks come back after its heartbeat timeout
            ledger.heartbeat(name)
            time.sleep(0.02)
        elif rng.random() < arg.get("fail", 0.0):
            events.append(["fail", task.id, ledger.fail(task.id, name, "injected")])
        else:
            events.append(["ok" if ledger.succeed(task.id, name, {"by": name}) else "refused", task.id])
elif mode == "die":  # claim some tasks, report them, then wait to be killed with SIGKILL
    events = [ledger.claim(name).id for _ in range(arg["claims"])]
    print(json.dumps(events), flush=True)
    time.sleep(120)
elif mode == "plan":  # several planners over overlapping windows, one chunk at a time
    for chunk in arg["chunks"]:
        windows = [(w, [DataTask(f"s.{w}.src.{i}", "s", "src", w, "file:///f", "/f", "parquet", 1)
                        for i in range(arg["tasks"])]) for w in chunk]
        events.append([chunk, ledger.add_windows("s", windows)])
elif mode == "append":  # a Sink: appends its windows in time order
    for window in arg["windows"]:
        try:
            events.append(["queued", window, queue.append("s", window, "/" + name, 1).seq])
        except OutOfOrderWindow:
            events.append(["refused", window, None])
elif mode == "read":  # the trainer: polls with after_seq until the sinks are done
    seq, done = 0, False
    while not done:
        done = os.path.exists(arg["done"])  # one more poll after the sinks finished
        for w in queue.windows("s", after_seq=seq):
            events.append([w.seq, w.window])
            seq = w.seq
        time.sleep(0.001)
print(json.dumps(events), flush=True)
"""


def _spawn(mode: str, url: str, name: str, gate: Path, **arg) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", WORKER, mode, url, name, str(gate), json.dumps(arg)]
    _SPAWNED.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True))
    return _SPAWNED[-1]


def _release(gate: Path, names: list[str], procs: list[subprocess.Popen]) -> float:
    """Open the gate once every worker is set up; returns the instant it opened."""
    deadline = time.monotonic() + 120
    while not all(Path(f"{gate}.{n}").exists() for n in names):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a worker did not start"
        time.sleep(0.01)
    gate.touch()
    return time.perf_counter()


def _results(procs: list[subprocess.Popen], timeout: float = 240) -> list:
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, stdout
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


@pytest.fixture
def pg_url(postgres_server):
    url = postgres_server.create_database("ledger_mp")
    yield url
    dispose(url)


def _plan(url: str, windows: int, tasks: int) -> list[str]:
    ledger = TaskLedger(url)
    ids = []
    for w in range(windows):
        wid = f"20261101T{w:02d}0000Z"
        planned = [
            DataTask(f"s.{wid}.src.{i:04d}", "s", "src", wid, "file:///f", "/f", "parquet", 1) for i in range(tasks)
        ]
        ledger.add_window("s", wid, planned)
        ids += [t.id for t in planned]
    return ids


@pytest.fixture(autouse=True)
def _no_leftover_workers():
    yield
    for proc in _SPAWNED:  # a failed test must not leave workers talking to the server
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    _SPAWNED.clear()


@pytest.mark.parametrize(("processes", "windows", "tasks", "fail"), [(6, 8, 75, 0.0), (4, 4, 50, 0.3)])
def test_concurrent_executors_claim_every_task_exactly_once(pg_url, tmp_path, processes, windows, tasks, fail):
    ids = _plan(pg_url, windows, tasks)
    names = [f"x{i}" for i in range(processes)]
    procs = [_spawn("claim", pg_url, n, tmp_path / "go", fail=fail) for n in names]
    began = _release(tmp_path / "go", names, procs)
    events = [e for result in _results(procs) for e in result]
    elapsed = time.perf_counter() - began
    claims = collections.Counter(e[1] for e in events)
    succeeded = collections.Counter(e[1] for e in events if e[0] == "ok")
    assert sorted(succeeded) == sorted(ids) and set(succeeded.values()) == {1}  # each task done exactly once
    assert not [e for e in events if e[0] == "refused"]  # nobody lost a task it held
    records = {r.task.id: r for r in TaskLedger(pg_url).records("s")}
    assert all(r.state == SUCCEEDED for r in records.values())
    assert {i: records[i].attempts for i in ids} == {i: claims[i] for i in ids}  # every claim counted
    if fail == 0.0:
        assert set(claims.values()) == {1}  # no task handed to two executors
    print(
        f"{processes} processes x {len(ids)} tasks: {sum(claims.values())} claims, "
        f"{sum(claims.values()) - len(ids)} retries, 0 duplicates, {elapsed:.2f} s"
    )


# Silence that marks an executor dead: long enough that a live claimer starved by a loaded machine
# (it heartbeats with every claim and every idle poll) is never taken for dead; the test waits it once.
HEARTBEAT_TIMEOUT_S = 10.0


def test_the_tasks_of_a_killed_executor_are_reclaimed_and_done_once(pg_url, tmp_path):
    ids = _plan(pg_url, 2, 40)
    dying = _spawn("die", pg_url, "doomed", tmp_path / "go", claims=5, timeout=HEARTBEAT_TIMEOUT_S)
    names = ["x0", "x1", "x2"]
    procs = [_spawn("claim", pg_url, n, tmp_path / "go", timeout=HEARTBEAT_TIMEOUT_S) for n in names]
    _release(tmp_path / "go", ["doomed", *names], [dying, *procs])
    held = json.loads(dying.stdout.readline())
    os.kill(dying.pid, signal.SIGKILL)  # mid-task, no release: only its silence tells
    dying.wait(timeout=30)
    events = [e for result in _results(procs) for e in result]
    succeeded = collections.Counter(e[1] for e in events if e[0] == "ok")
    assert sorted(succeeded) == sorted(ids) and set(succeeded.values()) == {1}
    records = {r.task.id: r for r in TaskLedger(pg_url).records("s")}
    assert len(held) == 5 and all(records[i].attempts == 2 for i in held)  # the dead claim, the redo
    assert not TaskLedger(pg_url).succeed(held[0], "doomed", {})  # a late report is refused


def test_concurrent_planners_plan_each_window_once(pg_url, tmp_path):
    windows = [f"20261101T{h:02d}0000Z" for h in range(24)]
    chunks = {f"p{i}": [windows[j : j + 4] for j in range(i, 24, 3)] for i in range(4)}  # overlapping chunks
    procs = [_spawn("plan", pg_url, name, tmp_path / "go", chunks=c, tasks=20) for name, c in chunks.items()]
    _release(tmp_path / "go", list(chunks), procs)
    added = sum(n for result in _results(procs) for _, n in result)
    ledger = TaskLedger(pg_url)
    assert added == 24 and ledger.planned_windows("s") == windows
    assert ledger.counts("s")["pending"] == 24 * 20


@pytest.mark.parametrize("overlap", [3, 1], ids=["sinks-share-windows", "sinks-own-windows"])
def test_concurrent_sinks_keep_time_order_and_the_reader_misses_nothing(pg_url, tmp_path, overlap):
    windows = [f"202611{1 + h // 24:02d}T{h % 24:02d}0000Z" for h in range(120)]
    sinks = {f"s{i}": [w for j, w in enumerate(windows) if (j + i) % 5 < overlap] for i in range(5)}
    TrainingQueue(pg_url)  # the schema before the race
    reader = _spawn("read", pg_url, "reader", tmp_path / "go", done=str(tmp_path / "done"))
    procs = [_spawn("append", pg_url, name, tmp_path / "go", windows=w) for name, w in sinks.items()]
    _release(tmp_path / "go", ["reader", *sinks], [reader, *procs])
    events = [e for result in _results(procs) for e in result]
    (tmp_path / "done").touch()
    seen = _results([reader])[0]
    queued = [(w.seq, w.window) for w in TrainingQueue(pg_url).windows("s")]
    order = [w for _, w in queued]
    assert order == sorted(order) and len(set(order)) == len(order)  # never both past the order check
    assert [tuple(e) for e in seen] == queued  # polling with after_seq skipped nothing
    got = {(w, seq) for kind, w, seq in events if kind == "queued"}
    assert got == set(map(tuple, map(reversed, queued)))  # every sink of a window got its one seq
    refused = {w for kind, w, _ in events if kind == "refused"}
    assert not refused & set(order) and all(w < order[-1] for w in refused)
    print(f"5 sinks x {sum(map(len, sinks.values()))} appends: {len(order)} queued, {len(refused)} refused")


def test_a_forked_child_uses_its_own_connections(pg_url):
    """One engine per URL per process: a child forked while the parent holds pooled connections
    opens its own, and the parent's keep working after the child is gone."""
    ledger = TaskLedger(pg_url)
    ids = _plan(pg_url, 1, 4)
    first = ledger.claim("parent")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            mine = TaskLedger(pg_url)
            os.write(write, json.dumps([mine.claim("child").id, mine.engine is not ledger.engine]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        claimed, own_engine = json.loads(pipe.read())
    os.waitpid(child, 0)
    assert own_engine and claimed == ids[1]
    assert [first.id, ledger.claim("parent").id] == [ids[0], ids[2]]  # the parent's pool still works


def test_a_job_with_a_database_keeps_its_ledger_and_queue_there(postgres_server, tmp_path):
    from primus_lib.data.executor.batch import run_window
    from primus_lib.paths import JobPaths
    from tests.fixtures.specs import load

    write_layout(tmp_path / "data", hours=1, rows=50, files=2)
    url = postgres_server.create_database("ledger_job")
    database = url.replace(f":{postgres_server.password}@", ":${PRIMUS_TEST_DB_PASSWORD}@")
    storage = {"root": str(tmp_path / "jobs"), "database": database}
    doc = demo_doc(f"file://{tmp_path / 'data'}", hours=1, rows_per_shard=100, storage=storage)
    job = load(doc, env={"PRIMUS_TEST_DB_PASSWORD": postgres_server.password})
    paths = JobPaths.for_job(job)
    secret = postgres_server.password
    shown = [repr(job.spec.storage), str(job.spec.storage), repr(paths), str(paths.ledger), repr(paths.ledger)]
    shown += [repr(TaskLedger(paths.ledger)), repr(TrainingQueue(paths.ledger))]
    assert all(secret not in text for text in shown) and "***" in shown[0]
    try:
        result = run_window(job, "history", T0, workers=2)
        queued = TrainingQueue(paths.ledger).windows("history")
        assert [(w.window, w.rows) for w in queued] == [(result.queued.window, result.manifest.rows)]
        assert TaskLedger(paths.ledger).counts("history")["succeeded"] == 4  # 2 + 2 files
        assert not (paths.root / "ledger.sqlite").exists()
    finally:
        dispose(paths.ledger)


def test_an_unreachable_database_is_named_without_its_password(monkeypatch):
    monkeypatch.setattr(db, "RETRY_SECONDS", 1.0)  # a refused connection is waited for (a restarting server)
    url = f"postgresql+psycopg2://primus:s3cret-pw@127.0.0.1:{free_port()}/jobs"
    with pytest.raises(DatabaseError) as caught:
        TaskLedger(url)
    assert "s3cret-pw" not in str(caught.value) and "primus:***@127.0.0.1" in str(caught.value)
    dispose(url)
