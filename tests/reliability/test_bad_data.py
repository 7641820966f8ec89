"""Bad batch data through the product's own paths: the Airflow data task (``execute_task``), a
whole window (plan, tasks, join, commit: ``run_window``), ``primus plan`` and ``primus eval``.

Every failure is one message naming the file (or partition/window) and what was expected; a
failed window leaves nothing committed (read back with the product's readers). Data richer than
the spec (an extra column) is not an error. Decisions: docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from primus_lib.data.dtgg import plan_source
from primus_lib.data.executor import JoinError, TaskFailed, execute_task, run_window, staging_path
from primus_lib.data.schema import job_keys, sample_schema
from primus_lib.data.shards import read_manifest, read_window
from primus_lib.data.sources.quality import WindowDataError
from primus_lib.data.training_queue import TrainingQueue
from primus_lib.paths import JobPaths
from primus_lib.spec import load_job
from tests.data.helpers import T0, impressions, write_layout
from tests.fixtures.specs import batch_stream, demo_doc, replay_stream, write_spec

HOUR0 = f"{T0:%Y%m%d}/{T0:%H}"


@pytest.fixture
def data(tmp_path) -> Path:
    root = tmp_path / "data"
    write_layout(root, hours=2, rows=40, files=1)
    return root


def _spec(tmp_path: Path, data: Path, *, replay: bool = False) -> Path:
    fields = {}
    if replay:  # for `primus eval`: the stream is a file replay of the impressions, no Kafka needed
        events = data / "stream" / "events.jsonl"
        events.parent.mkdir(exist_ok=True)
        rows = [r | {"clicked": 0} for h in (0, 1) for r in _pristine(h).to_pylist()]
        events.write_text("".join(json.dumps(r) + "\n" for r in rows))
        batch = batch_stream(f"file://{data}", lag="1h", rows_per_shard=100)
        fields = {"streams": [batch, replay_stream(f"file://{events}")], "batch_size": 32}
    storage = {"root": str(tmp_path / "jobs")}
    doc = demo_doc(f"file://{data}", hours=2, rows_per_shard=100, storage=storage, **fields)
    doc["spec"]["features"]["id"] = "request_id"
    return write_spec(tmp_path / "job.yaml", doc)


def _pristine(hour: int) -> pa.Table:
    return impressions(T0 + timedelta(hours=hour), 40, seed=hour * 100)  # what write_layout wrote


def _file(data: Path, source: str, hour: int = 0) -> Path:
    when = T0 + timedelta(hours=hour)
    return data / source / f"{when:%Y%m%d}" / f"{when:%H}" / "part-000.parquet"


def _rewrite(path: Path, change) -> None:
    pq.write_table(change(pq.read_table(path)), path)


def _set(table: pa.Table, name: str, values: list) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, pa.array(values))


def _nothing_committed(job) -> None:
    paths = JobPaths.for_job(job)
    assert read_manifest(paths.window_dir("history", T0)) is None
    assert TrainingQueue(paths.ledger).windows("history") == []


# (case, source whose hour-0 file is spoiled, how, what the message must also name)
FILE_CASES = [
    ("corrupt-parquet", "impressions", lambda p: p.write_bytes(b"PAR1 not a parquet file at all"), "cannot read as parquet"),
    ("truncated-parquet", "impressions", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "cannot read as parquet"),
    ("empty-file", "clicks", lambda p: p.write_bytes(b""), "cannot read as parquet"),
    ("missing-join-key", "clicks", lambda p: _rewrite(p, lambda t: t.drop_columns(["request_id"])), "missing column 'request_id'"),
    ("timestamp-not-a-time", "impressions", lambda p: _rewrite(p, lambda t: _set(t, "ts", ["yesterday"] * t.num_rows)), "column 'ts'"),
    ("dense-not-a-number", "impressions", lambda p: _rewrite(p, lambda t: _set(t, "price", ["cheap"] * t.num_rows)), "column 'price'"),
    ("label-not-a-number", "clicks", lambda p: _rewrite(p, lambda t: _set(t, "clicked", ["yes"] * t.num_rows)), "column 'clicked'"),
    ("sparse-id-a-list", "impressions", lambda p: _rewrite(p, lambda t: _set(t, "user_id", [[1, 2]] * t.num_rows)), "column 'user_id'"),
]  # fmt: skip # a table: one case per row, its four columns read across


@pytest.mark.parametrize(("source", "spoil", "names"), [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_bad_file_fails_its_data_task_naming_file_and_column(tmp_path, data, source, spoil, names):
    """The Airflow data task (PrimusDataTaskOperator -> execute_task) fails with one line; nothing staged."""
    bad = _file(data, source)
    spoil(bad)
    job = load_job(_spec(tmp_path, data), env={})
    (task,) = plan_source(job, "history", source, T0)
    with pytest.raises(Exception) as caught:
        execute_task(job, task)
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    assert str(bad) in message and names in message, message
    staged = staging_path(job, task)
    assert not staged.exists()
    assert not staged.parent.exists() or list(staged.parent.iterdir()) == []  # no temp file left


@pytest.mark.parametrize("case", ["corrupt-parquet", "missing-join-key"])
def test_bad_file_fails_the_window_and_commits_nothing(tmp_path, data, case):
    _, source, spoil, names = next(c for c in FILE_CASES if c[0] == case)
    spoil(_file(data, source))
    job = load_job(_spec(tmp_path, data), env={})
    with pytest.raises(TaskFailed) as caught:
        run_window(job, "history", T0, workers=1)
    assert str(_file(data, source)) in str(caught.value) and names in str(caught.value)
    _nothing_committed(job)


def test_feature_column_no_source_provides_fails_the_join_naming_window_and_column(tmp_path, data):
    """In a joined stream any source may carry a feature column, so its absence is known only at the join."""
    _rewrite(_file(data, "impressions"), lambda t: t.drop_columns(["item_id"]))
    job = load_job(_spec(tmp_path, data), env={})
    with pytest.raises(
        JoinError, match=r"window 20261101T000000Z of stream 'history': no source provides column 'item_id'"
    ):
        run_window(job, "history", T0, workers=1)
    _nothing_committed(job)


def test_vanished_file_names_it(tmp_path, data):
    job = load_job(_spec(tmp_path, data), env={})
    (task,) = plan_source(job, "history", "impressions", T0)
    _file(data, "impressions").unlink()
    with pytest.raises(FileNotFoundError, match="vanished after planning") as caught:
        execute_task(job, task)
    assert str(_file(data, "impressions")) in str(caught.value)


def _plan(spec: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PRIMUS_HOME": str(tmp_path / "home")}
    command = [
        sys.executable,
        "-m",
        "primus_lib.cli.main",
        "plan",
        str(spec),
        "--dry-run",
        "--end",
        "2026-11-01T01:00:00Z",
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", ["data-without-marker", "late-partition"])
def test_incomplete_partition_waits_and_is_picked_up_when_complete(tmp_path, data, case):
    directory = _file(data, "clicks").parent
    if case == "data-without-marker":
        (directory / "_SUCCESS").unlink()
        expected = "success marker '_SUCCESS' not found"
    else:
        directory.rename(directory.with_name("hidden"))
        expected = "directory not found"
    spec = _spec(tmp_path, data)
    done = _plan(spec, tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    waiting = [line for line in done.stdout.splitlines() if line.startswith("waiting: ")]
    assert len(waiting) == 1 and f"file://{directory}/" in waiting[0] and expected in waiting[0], done.stdout
    job = load_job(spec, env={})
    with pytest.raises(Exception, match="incomplete or late"):
        run_window(job, "history", T0, workers=1)
    _nothing_committed(job)
    if case == "data-without-marker":  # the producer finishes: the next attempt takes the window
        (directory / "_SUCCESS").touch()
    else:
        directory.with_name("hidden").rename(directory)
    assert _plan(spec, tmp_path).returncode == 0
    assert run_window(job, "history", T0, workers=1).manifest.rows == 40


@pytest.mark.parametrize("case", ["marker-without-data", "empty-partition"])
def test_complete_partition_without_rows_commits_an_empty_window(tmp_path, data, case):
    for source in ("impressions", "clicks"):
        if case == "marker-without-data":
            _file(data, source).unlink()
        else:
            _rewrite(_file(data, source), lambda t: t.slice(0, 0))
    job = load_job(_spec(tmp_path, data), env={})
    result = run_window(job, "history", T0, workers=1)
    assert result.manifest.rows == 0 and result.manifest.extra["sources"] == {"impressions": 0, "clicks": 0}
    assert TrainingQueue(JobPaths.for_job(job).ledger).windows("history")[0].rows == 0


def test_extra_column_is_not_an_error(tmp_path, data):
    _rewrite(_file(data, "impressions"), lambda t: t.append_column("debug_blob", pa.array(["x"] * t.num_rows)))
    job = load_job(_spec(tmp_path, data), env={})
    result = run_window(job, "history", T0, workers=1)
    table = read_window(JobPaths.for_job(job).window_dir("history", T0))
    assert table.schema == sample_schema(job.spec.features, job_keys(job)) and table.num_rows == 40
    assert "dropped" not in result.manifest.extra


def test_duplicated_sample_ids_are_kept_once_and_counted(tmp_path, data):
    path = _file(data, "impressions")
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table.slice(0, 5)]), path)  # five samples logged twice
    job = load_job(_spec(tmp_path, data), env={})
    manifest = run_window(job, "history", T0, workers=1).manifest
    assert manifest.rows == 40 and manifest.extra["dropped"] == {"duplicate_id": 5}
    ids = read_window(JobPaths.for_job(job).window_dir("history", T0)).column("request_id").to_pylist()
    assert len(set(ids)) == len(ids) == 40


@pytest.mark.parametrize(
    ("case", "offset_ms"),
    [("before-window", -3_600_000), ("after-window", 3_600_000), ("in-the-future", 4 * 365 * 86_400_000)],
)
def test_rows_outside_the_window_are_dropped_and_counted(tmp_path, data, case, offset_ms):
    def shift(t: pa.Table) -> pa.Table:
        ts = t.column("ts").to_pylist()
        return _set(t, "ts", [v + offset_ms if i < 7 else v for i, v in enumerate(ts)])

    _rewrite(_file(data, "impressions"), shift)
    job = load_job(_spec(tmp_path, data), env={})
    manifest = run_window(job, "history", T0, workers=1).manifest
    assert manifest.rows == 33 and manifest.extra["dropped"] == {"outside_window": 7}
    ts = read_window(JobPaths.for_job(job).window_dir("history", T0)).column("ts").to_pylist()
    assert all(T0.timestamp() * 1000 <= v < (T0.timestamp() + 3600) * 1000 for v in ts)


def test_window_with_no_row_of_its_time_fails_and_commits_nothing(tmp_path, data):
    _rewrite(_file(data, "impressions"), lambda t: _set(t, "ts", [v - 86_400_000 for v in t.column("ts").to_pylist()]))
    job = load_job(_spec(tmp_path, data), env={})
    with pytest.raises(WindowDataError, match=r"window 20261101T000000Z: all 40 rows have 'ts' outside"):
        run_window(job, "history", T0, workers=1)
    _nothing_committed(job)


def _eval(spec: Path, out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PRIMUS_DATA"}
    env["PRIMUS_HOME"] = str(out.parent / "home")
    command = [
        sys.executable,
        "-m",
        "primus_lib.cli.main",
        "eval",
        str(spec),
        "--out",
        str(out),
        "--quiet",
        "--modes",
        "offline",
        "--seeds",
        "0",
        "--eval-from",
        "2026-11-01T01:00:00Z",
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


# eval decodes files with the data task's read_task: one bad file here, the rest above
EVAL_CASES = ["corrupt-parquet", "missing-feature-column", "data-without-marker", "no-row-in-window"]


@pytest.mark.parametrize("case", EVAL_CASES)
def test_eval_refuses_bad_data_in_one_line(tmp_path, data, case):
    if case == "data-without-marker":
        (_file(data, "clicks").parent / "_SUCCESS").unlink()
        names = [str(_file(data, "clicks").parent), "_SUCCESS missing"]
    elif case == "missing-feature-column":
        _rewrite(_file(data, "impressions"), lambda t: t.drop_columns(["item_id"]))
        names = ["window 20261101T000000Z", "'item_id'"]
    elif case == "no-row-in-window":
        _rewrite(
            _file(data, "impressions"), lambda t: _set(t, "ts", [v + 86_400_000 for v in t.column("ts").to_pylist()])
        )
        names = ["window 20261101T000000Z", "'ts' outside"]
    else:
        _, source, spoil, name = next(c for c in FILE_CASES if c[0] == case)
        spoil(_file(data, source))
        names = [str(_file(data, source)), name]
    out = tmp_path / "out"
    done = _eval(_spec(tmp_path, data, replay=True), out)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("primus eval: "), done.stderr
    assert all(n in lines[0] for n in names), lines[0]
    assert not (out / "report.json").exists()


def test_eval_of_a_job_without_a_stream_says_what_it_needs(tmp_path, data):
    spec = _spec(tmp_path, data, replay=True)
    doc = yaml.safe_load(spec.read_text())
    doc["spec"]["dataset"]["streams"] = doc["spec"]["dataset"]["streams"][:1]
    doc["spec"]["training"].update(mode="offline", priority={"history": 1.0})
    write_spec(spec, doc)
    done = _eval(spec, tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip() == (
        "primus eval: job 'ctr-demo': primus eval needs a batch and a stream stream in spec.dataset.streams "
        "(it scores every window on the stream), found history (batch)"
    )


def test_eval_trains_on_richer_data_and_reports_what_it_dropped(tmp_path, data):
    def spoil(t: pa.Table) -> pa.Table:
        t = t.append_column("debug_blob", pa.array(["x"] * t.num_rows))
        return pa.concat_tables([t, t.slice(0, 3)])  # three samples twice

    for hour in (0, 1):
        _rewrite(_file(data, "impressions", hour), spoil)
    out = tmp_path / "out"
    done = _eval(_spec(tmp_path, data, replay=True), out)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "dropped rows (6 duplicate id)" in done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["windows"][0]["offline"]["samples"] == 40
