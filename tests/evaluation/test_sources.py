"""`primus eval SPEC --out DIR` on a user's own logs: the sources the spec names, nothing else.

The logs are laid out unlike `primus datagen`'s: impressions as several parquet files per hour
under a Hive-style template with a `_DONE` marker and renamed columns, clicks as one csv file
per hour (the template's last component names the file), and the stream as one csv file with
its timestamps in epoch seconds. No `--data`, no PRIMUS_DATA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest

from primus_lib.data.datagen import generate
from tests.fixtures.specs import FEATURES, job_doc, write_spec
from tests.train.conftest import START

HOURS = 6


def _own_logs_doc(root: Path) -> dict:
    """A user's own layout: views (renamed columns, a _DONE marker) joined with hourly CSV clicks,
    and a CSV event log with epoch seconds as the stream."""
    views = {
        "name": "views",
        "uri": f"file://{root}/warehouse/views/dt={{YYYY}}-{{MM}}-{{DD}}/hr={{HH}}/",
        "format": "parquet",
        "file_pattern": "*.parquet",
        "success_marker": "_DONE",
        "columns": {"user_id": "uid", "ts": "event_time"},
    }
    clicks = {
        "name": "clicks",
        "uri": f"file://{root}/warehouse/clicks/{{YYYY}}/{{MM}}/{{DD}}/{{HH}}.csv",
        "format": "csv",
    }
    join = {"keys": ["request_id"], "how": "left", "fill": {"clicked": 0}}
    events = {
        "name": "events",
        "uri": f"file://{root}/logs/events.csv",
        "format": "csv",
        "columns": {"user_id": "uid", "ts": "event_seconds"},
    }
    streams = [
        {"name": "history", "kind": "batch", "lag": "2h", "sources": [views, clicks], "join": join},
        {"name": "live", "kind": "stream", "sources": [events]},
    ]
    features = {k: v for k, v in FEATURES.items() if k != "id"}
    training = {"batch_size": 64, "learning_rate": 0.01, "priority": {"history": 1.0, "live": 4.0}}
    return job_doc("own-logs", hours=HOURS, streams=streams, features=features, training=training)


def _own_logs(root: Path) -> Path:
    """Datagen's logs rewritten into the user's layout; returns the spec."""
    data = root / "datagen"
    generate(data, START, START + timedelta(hours=HOURS), rows_per_hour=150, seed=7)
    for h in range(HOURS):
        hour = START + timedelta(hours=h)
        views = pq.read_table(data / "impressions" / f"{hour:%Y%m%d/%H}" / "part-00000.parquet")
        views = views.rename_columns(["uid" if c == "user_id" else c for c in views.column_names])
        ms = views.column("ts").cast(pa.timestamp("ms", tz="UTC"))
        views = views.set_column(views.column_names.index("ts"), "event_time", ms)
        directory = root / "warehouse" / "views" / f"dt={hour:%Y-%m-%d}" / f"hr={hour:%H}"
        directory.mkdir(parents=True)
        half = views.num_rows // 2
        pq.write_table(views.slice(0, half), directory / "a.parquet")
        pq.write_table(views.slice(half), directory / "b.parquet")
        (directory / "_DONE").touch()
        clicks = pq.read_table(data / "clicks" / f"{hour:%Y%m%d/%H}" / "part-00000.parquet")
        directory = root / "warehouse" / "clicks" / f"{hour:%Y/%m/%d}"
        directory.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(clicks, directory / f"{hour:%H}.csv")
    events = pajson.read_json(data / "stream" / "events.jsonl")
    events = events.rename_columns(["uid" if c == "user_id" else c for c in events.column_names])
    seconds = pc.divide(events.column("ts"), 1000)
    events = events.set_column(events.column_names.index("ts"), "event_seconds", seconds)
    (root / "logs").mkdir()
    pacsv.write_csv(events, root / "logs" / "events.csv")
    return write_spec(root / "own-logs.yaml", _own_logs_doc(root))


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
        "--modes",
        "mtrm,online",
        "--seeds",
        "0",
        "--eval-from",
        "2026-11-01T03:00:00Z",
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def own_logs(tmp_path) -> Path:
    return _own_logs(tmp_path)


def test_eval_reads_the_sources_the_spec_names(own_logs, tmp_path):
    out = tmp_path / "out"
    done = _eval(own_logs, out)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert set(report["modes"]) == {"mtrm", "online"}
    assert [w["window"] for w in report["windows"]] == ["20261101T030000Z", "20261101T040000Z", "20261101T050000Z"]
    for window in report["windows"]:
        for mode in ("mtrm", "online"):
            assert 0.0 < window[mode]["auc"] < 1.0 and window[mode]["samples"] > 100
    assert report["modes"]["mtrm"]["steps"]["batch"] > 0 and report["modes"]["mtrm"]["steps"]["stream"] > 0


def test_corrupt_parquet_is_one_line_naming_the_file(own_logs, tmp_path):
    bad = tmp_path / "warehouse" / "views" / "dt=2026-11-01" / "hr=02" / "b.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file")
    done = _eval(own_logs, tmp_path / "out")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(bad) in lines[0] and lines[0].startswith("primus eval: ")


def test_missing_partition_is_one_line_naming_it(own_logs, tmp_path):
    (tmp_path / "warehouse" / "views" / "dt=2026-11-01" / "hr=04" / "_DONE").unlink()
    done = _eval(own_logs, tmp_path / "out")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "hr=04" in lines[0] and "_DONE" in lines[0], done.stderr


@pytest.mark.integration
def test_eval_reads_a_kafka_topic_from_the_earliest_offset_to_the_end(kafka_broker, tmp_path, monkeypatch, capsys):
    """The stream is the spec's Kafka topic (2 partitions), read up to the end and no further."""
    from primus_lib.cli.main import main
    from tests.fixtures.specs import job_doc, kafka_stream
    from tests.train.conftest import write_job

    topic = kafka_broker.new_topic(partitions=2, prefix="eval")
    doc = job_doc(hours=2, lag="1h", stream=kafka_stream(kafka_broker.bootstrap, topic), mode="mtrm")
    spec = write_job(tmp_path, monkeypatch, doc, "kafka.yaml")
    assert main(["datagen", str(spec), "--rows-per-hour", "100", "--seed", "2", "--kafka", kafka_broker.bootstrap]) == 0
    capsys.readouterr()
    events = pajson.read_json(tmp_path / "data" / "stream" / "events.jsonl")
    in_last_hour = pc.sum(pc.greater_equal(events.column("ts"), int((START + timedelta(hours=1)).timestamp() * 1000)))
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "primus_lib.cli.main",
        "eval",
        str(spec),
        "--out",
        str(out),
        "--modes",
        "mtrm,online",
        "--seeds",
        "0",
    ]
    done = subprocess.run(command, env=dict(os.environ), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert [w["window"] for w in report["windows"]] == ["20261101T010000Z"]
    assert report["windows"][0]["mtrm"]["samples"] == in_last_hour.as_py() > 50
