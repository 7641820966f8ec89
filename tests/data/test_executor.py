from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from primus_lib.data.dtgg import Planner, plan_source
from primus_lib.data.executor import (
    BatchExecutor,
    JoinError,
    execute_task,
    join_window,
    run_window,
    sink_window,
    staging_path,
    window_seed,
)
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.schema import job_keys, sample_schema
from primus_lib.data.shards import read_manifest, read_window
from primus_lib.data.training_queue import OutOfOrderWindow, TrainingQueue
from primus_lib.paths import JobPaths
from tests.data.helpers import T0, write_layout
from tests.fixtures.specs import demo_doc, load, write_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def data(tmp_path):
    counts = write_layout(tmp_path / "data", hours=3, rows=150, files=3)
    return tmp_path / "data", counts


def _job(data_dir: Path, home: Path):
    return load(demo_doc(f"file://{data_dir}", hours=3, rows_per_shard=100), storage=home / "jobs")


def _impressions(data_dir: Path, hour: int) -> pa.Table:
    d = data_dir / "impressions" / f"{T0 + timedelta(hours=hour):%Y%m%d/%H}"
    return pa.concat_tables(pq.read_table(p) for p in sorted(d.glob("*.parquet")))


def _clicked(data_dir: Path, hour: int) -> set[str]:
    d = data_dir / "clicks" / f"{T0 + timedelta(hours=hour):%Y%m%d/%H}"
    return {r for p in d.glob("*.parquet") for r in pq.read_table(p).column("request_id").to_pylist()}


def test_run_window_joins_shuffles_and_commits_the_full_schema(data, tmp_path):
    data_dir, counts = data
    job = _job(data_dir, tmp_path / "a")
    result = run_window(job, "history", T0, workers=2)
    table = read_window(Path(result.queued.path))
    assert table.schema == sample_schema(job.spec.features, job_keys(job))
    imp = _impressions(data_dir, 0)
    assert table.num_rows == imp.num_rows == counts[("impressions", 0)] == result.manifest.rows
    assert sorted(table.column("request_id").to_pylist()) == sorted(imp.column("request_id").to_pylist())
    clicked = _clicked(data_dir, 0)
    labels = dict(zip(table.column("request_id").to_pylist(), table.column("clicked").to_pylist(), strict=True))
    assert all(labels[r] == (1.0 if r in clicked else 0.0) for r in labels)  # left join, fill clicked: 0
    ts = {r: t for r, t in zip(imp.column("request_id").to_pylist(), imp.column("ts").to_pylist(), strict=True)}
    assert all(
        ts[r] == t for r, t in zip(table.column("request_id").to_pylist(), table.column("ts").to_pylist(), strict=True)
    )
    manifest = result.manifest
    assert [s.rows for s in manifest.shards] == [100, 100, 100, 100, 50]  # rows_per_shard 100
    assert manifest.seed == window_seed(job, "history", manifest.window)
    assert manifest.extra["sources"] == {"impressions": 450, "clicks": counts[("clicks", 0)]}
    # shuffled: not in file order
    assert table.column("request_id").to_pylist() != imp.column("request_id").to_pylist()
    assert TrainingQueue(JobPaths.for_job(job).ledger).windows("history")[0].window == "20261101T000000Z"


def test_a_rerun_of_a_window_yields_the_same_bytes(data, tmp_path):
    data_dir, _ = data
    a = run_window(_job(data_dir, tmp_path / "a"), "history", T0, workers=2).manifest
    b = run_window(_job(data_dir, tmp_path / "b"), "history", T0, workers=1).manifest
    assert [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards]
    c = run_window(_job(data_dir, tmp_path / "a"), "history", T0).manifest  # already committed: kept
    assert c == a


def test_airflow_calls_one_by_one_and_sink_order(data, tmp_path):
    data_dir, _ = data
    job = _job(data_dir, tmp_path / "a")
    w1 = T0 + timedelta(hours=1)
    with pytest.raises(JoinError, match="has no staged output"):
        join_window(job, "history", w1)
    outputs = []
    for source in ("impressions", "clicks"):
        for task in plan_source(job, "history", source, w1):
            raw = json.loads(json.dumps(task.to_dict()))  # what XCom does
            from primus_lib.data.dtgg import DataTask

            outputs.append(execute_task(job, DataTask.from_dict(raw)))
    again = execute_task(job, plan_source(job, "history", "impressions", w1)[0])
    assert again == outputs[0]  # idempotent
    torn = Path(outputs[0].path)
    torn.write_bytes(torn.read_bytes()[:100])  # a host crash tore the (not fsynced) staged file
    assert execute_task(job, plan_source(job, "history", "impressions", w1)[0]) == outputs[0]  # staged again
    assert outputs[0].path == str(staging_path(job, plan_source(job, "history", "impressions", w1)[0]))
    manifest = join_window(job, "history", w1)
    assert manifest.rows == 450
    queued = sink_window(job, "history", w1)
    assert queued.rows == 450 and sink_window(job, "history", w1) == queued
    run_window(job, "history", T0 + timedelta(hours=2))
    with pytest.raises(OutOfOrderWindow):
        run_window(job, "history", T0)


def test_bad_file_fails_after_retries_with_its_name(data, tmp_path):
    data_dir, _ = data
    bad = data_dir / "impressions" / "20261101" / "02" / "part-001.parquet"
    bad.write_bytes(b"not parquet")
    job = _job(data_dir, tmp_path / "a")
    from primus_lib.data.executor import TaskFailed

    with pytest.raises(TaskFailed, match="part-001.parquet"):
        run_window(job, "history", T0 + timedelta(hours=2))
    records = TaskLedger(JobPaths.for_job(job).ledger).records("history", "20261101T020000Z")
    assert [r.attempts for r in records if r.state == "failed"] == [3]


def test_csv_and_jsonl_sources(tmp_path):
    data_dir = tmp_path / "data"
    write_layout(data_dir, hours=1, rows=40, files=1)
    hour = data_dir / "impressions" / "20261101" / "00"
    table = pq.read_table(hour / "part-000.parquet")
    (hour / "part-000.parquet").unlink()
    import pyarrow.csv as pacsv

    pacsv.write_csv(table.slice(0, 20), hour / "a.csv")
    (hour / "b.jsonl").write_text("\n".join(json.dumps(r) for r in table.slice(20).to_pylist()) + "\n")
    doc = demo_doc(f"file://{data_dir}", hours=1, rows_per_shard=100)
    doc["spec"]["dataset"]["streams"][0]["sources"][0].update(format="csv", file_pattern="*.csv")
    extra = dict(
        doc["spec"]["dataset"]["streams"][0]["sources"][0], name="more", format="jsonl", file_pattern="*.jsonl"
    )
    doc["spec"]["dataset"]["streams"][0]["sources"].insert(1, extra)
    doc["spec"]["dataset"]["streams"][0]["join"]["how"] = "left"
    job = load(doc, storage=tmp_path / "jobs")
    tasks = [t for s in ("impressions", "more") for t in plan_source(job, "history", s, T0)]
    assert [t.format for t in tasks] == ["csv", "jsonl"]
    assert sum(execute_task(job, t).rows for t in tasks) == 40


def test_killed_executor_tasks_are_redone_with_identical_output(data, tmp_path):
    data_dir, _ = data
    home = tmp_path / "killed"
    doc = demo_doc(f"file://{data_dir}", hours=3, rows_per_shard=100, storage={"root": str(home / "jobs")})
    spec = write_spec(tmp_path / "job.yaml", doc)
    from primus_lib.spec import load_job

    job = load_job(spec)
    list(Planner(job, "history").plan())  # 3 windows x 6 tasks in the ledger
    script = f"""
import sys, time
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from primus_lib.spec import load_job
from primus_lib.data.executor import batch
from primus_lib.data.executor.task import staging_path
job = load_job({str(spec)!r})
real = batch.execute_task
done = []
def slow(job, task):
    if len(done) >= 4:  # die while writing the 5th task: a torn temp file is all it leaves
        path = Path(staging_path(job, task))  # a local job: the OS path of its location
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_name("." + path.name + ".tmp-dead").write_bytes(b"ARROW1 torn")
        print("stuck", flush=True)
        time.sleep(600)
    out = real(job, task)
    done.append(task.id)
    return out
batch.execute_task = slow
batch.BatchExecutor(job, workers=1, executor_id="doomed", heartbeat_interval=0.2).run("history")
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "stuck"
        ledger = TaskLedger(JobPaths.for_job(job).ledger, heartbeat_timeout=0.5)
        assert ledger.counts("history") == {"pending": 13, "running": 1, "succeeded": 4, "failed": 0}
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 60
    while ledger.reclaim_dead() == 0:  # heartbeat timeout
        assert time.monotonic() < deadline
        time.sleep(0.1)
    stats = BatchExecutor(job, workers=2, ledger=ledger).run("history")
    assert stats.succeeded == 14 and stats.failed == 0
    assert ledger.counts("history") == {"pending": 0, "running": 0, "succeeded": 18, "failed": 0}
    clean = _job(data_dir, tmp_path / "clean")
    for h in range(3):
        start = T0 + timedelta(hours=h)
        killed_manifest = join_window(job, "history", start)
        clean_manifest = run_window(clean, "history", start).manifest
        assert [s.sha256 for s in killed_manifest.shards] == [s.sha256 for s in clean_manifest.shards]
        table = read_window(JobPaths.for_job(job).window_dir("history", start))
        ids = table.column("request_id")
        assert (
            pc.count_distinct(ids).as_py() == table.num_rows == _impressions(data_dir, h).num_rows
        )  # none lost or doubled
    assert read_manifest(JobPaths.for_job(job).window_dir("history", T0)).rows == 450
