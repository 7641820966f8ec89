"""The job's database (ledger + training queue on PostgreSQL) restarted under load.

Our own PostgreSQL cluster (devstack.postgres: the live stack's launcher), so the test can stop
and start it: four executor processes claim and complete tasks while a Sink process appends
windows to the training queue; the server is restarted twice (a fast shutdown, then an immediate
one: no shutdown checkpoint, crash recovery on start). Every task must be done exactly once and
every window queued exactly once, in order, without a worker crashing (``db.retried``). Past the
retry bound the error is one clear line. Counts by task id, as tests/test_share_nothing.py does.
"""

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

from devstack.postgres import ROLE, Postgres
from primus_lib.data import db
from primus_lib.data.db import DatabaseError, dispose
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.task import DataTask
from primus_lib.data.training_queue import TrainingQueue
from tests.fixtures.postgres import own_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STREAM = "s"
WINDOWS, TASKS, WORKERS, QUEUED = 6, 80, 4, 40

WORKER = r"""
import json, os, sys, time
mode, url, name, gate = sys.argv[1:5]
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.training_queue import TrainingQueue
ledger = TaskLedger(url, max_attempts=50)
queue = TrainingQueue(url)
open(gate + "." + name, "w").close()
while not os.path.exists(gate):
    time.sleep(0.005)
events = []
if mode == "claim":  # an executor: claim, work a little, report; until nothing is left
    while True:
        task = ledger.claim(name)
        if task is None:
            counts = ledger.counts()
            if counts["pending"] == counts["running"] == 0:
                break
            time.sleep(0.02)
            continue
        time.sleep(0.03)
        events.append(["ok" if ledger.succeed(task.id, name, {"by": name}) else "refused", task.id])
else:  # a Sink: appends windows in time order
    for i in range(int(mode)):
        window = f"20261101T{i // 4:02d}{i % 4 * 15:02d}00Z"
        events.append([window, queue.append("s", window, "/w/" + window, 1).seq])
        time.sleep(0.08)
print(json.dumps(events), flush=True)
"""


@pytest.fixture
def pg(tmp_path):
    with own_cluster(tmp_path, "pg-restart-secret") as server:
        # The launcher's cluster trades durability for speed (synchronous_commit=off: a crash may
        # lose commits it acknowledged); a production database does not, nor does this test's role.
        server._sql(f'ALTER ROLE "{ROLE}" SET synchronous_commit = on')
        try:
            yield server
        finally:
            dispose(server.url)


def _restart(server: Postgres, sig: int) -> None:
    """Stop the postmaster with ``sig`` (SIGINT: fast, SIGQUIT: immediate), stay down a moment, start."""
    assert server.daemon.stop(sig, timeout=60, group=False)
    time.sleep(1.5)  # clients see refused connections, not only dropped ones
    server.start()


def _spawn(mode: str, url: str, name: str, gate: Path, procs: list) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the workers wait out the restarts (120 s bound)
    args = [sys.executable, "-c", WORKER, mode, url, name, str(gate)]
    procs.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


def _wait_until(check, what: str, procs: list, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        assert all(p.poll() is None for p in procs), f"a worker ended while waiting for {what}"
        time.sleep(0.05)


def test_restarts_under_load_lose_and_repeat_nothing(pg, tmp_path):
    ledger = TaskLedger(pg.url)
    ids = []
    for w in range(WINDOWS):
        window = f"20261101T{w:02d}0000Z"
        tasks = [
            DataTask(f"s.{window}.src.{i:04d}", STREAM, "src", window, "file:///f", "/f", "parquet", 1)
            for i in range(TASKS)
        ]
        assert ledger.add_window(STREAM, window, tasks)
        ids += [t.id for t in tasks]
    gate, procs = tmp_path / "go", []
    names = [f"x{i}" for i in range(WORKERS)]
    for name in names:
        _spawn("claim", pg.url, name, gate, procs)
    _spawn(str(QUEUED), pg.url, "sink", gate, procs)
    try:
        _wait_until(lambda: all(Path(f"{gate}.{n}").exists() for n in [*names, "sink"]), "the workers", procs)
        gate.touch()
        total = len(ids)
        _wait_until(lambda: ledger.counts()["succeeded"] >= total // 4, "a quarter done", procs)
        _restart(pg, signal.SIGINT)
        done_at_second = ledger.counts()["succeeded"]
        _wait_until(lambda: ledger.counts()["succeeded"] >= done_at_second + total // 5, "more progress", procs)
        _restart(pg, signal.SIGQUIT)
        results, retries = [], 0
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
            retries += err.count("database connection lost")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    events = [e for result in results[:WORKERS] for e in result]
    succeeded = collections.Counter(task for verdict, task in events if verdict == "ok")
    lost = set(ids) - set(succeeded)
    duplicated = {task: n for task, n in succeeded.items() if n > 1}
    print(
        f"\npostgres restart: {len(ids)} tasks planned, {sum(succeeded.values())} completions reported, "
        f"{len(lost)} lost, {len(duplicated)} duplicated, {retries} retried database operations"
    )
    assert not lost and not duplicated and sorted(succeeded) == sorted(ids)
    assert not [e for e in events if e[0] != "ok"]  # no executor was refused its own task
    records = ledger.records(STREAM)
    assert collections.Counter(r.state for r in records) == {"succeeded": len(ids)}
    done_by = {task: name for name, result in zip(names, results, strict=False) for _, task in result}
    assert {r.task.id: r.output["by"] for r in records} == done_by  # recorded by the executor that reported it
    queued = TrainingQueue(pg.url).windows(STREAM)
    sink = results[WORKERS]
    assert [w.window for w in queued] == [w for w, _ in sink] == sorted({w for w, _ in sink})  # once each, in order
    assert len(queued) == QUEUED and [w.seq for w in queued] == sorted(w.seq for w in queued)
    assert retries > 0  # the restarts did reach the workers


def test_past_the_retry_bound_the_error_is_one_clear_line(pg, monkeypatch):
    ledger = TaskLedger(pg.url)
    monkeypatch.setattr(db, "RETRY_SECONDS", 2.0)
    assert pg.stop()
    with pytest.raises(DatabaseError) as failed:
        ledger.counts()
    message = str(failed.value)
    assert "unreachable for 2s (the retry bound)" in message and "\n" not in message
    assert pg.password not in message
    pg.start()
    monkeypatch.setattr(db, "RETRY_SECONDS", 120.0)  # the default bound again: a busy host may be slow to accept
    assert ledger.counts()["pending"] == 0  # back without a new ledger: the pool reconnects
