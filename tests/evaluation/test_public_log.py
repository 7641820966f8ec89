"""The Open Bandit log packaged in obp: converted to partitions + a stream replay, then backtested."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from primus_lib.cli.main import main
from primus_lib.evaluation.public_log import PublicLogError, convert, packaged_files

SPEC = Path(__file__).resolve().parents[2] / "config" / "jobs" / "obd-eval.yaml"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("obd")
    return convert(out, late_fraction=0.2, seed=0)


def test_packaged_log_is_read_from_the_installed_wheel():
    files = packaged_files()
    assert len(files) == 6 and all(f.stat().st_size > 1_000_000 for f in files)


def test_converter_writes_hourly_partitions_and_a_delayed_stream(converted):
    out = converted.out
    parts = sorted(out.glob("impressions/*/*/part-00000.parquet"))
    assert converted.partitions == len(parts) == 7 * 24
    assert all((p.parent / "_SUCCESS").exists() for p in parts)
    batch_rows = sum(pq.read_metadata(p).num_rows for p in parts)
    events = [json.loads(line) for line in (out / "stream" / "events.jsonl").read_text().splitlines()]
    assert batch_rows == len(events) == converted.rows == 60_000
    batch_clicks = sum(int(pq.read_table(p, columns=["clicked"]).column(0).to_numpy().sum()) for p in parts)
    assert batch_clicks == converted.clicks > 0
    realtime = sum(e["clicked"] for e in events)
    assert realtime == converted.realtime_clicks and 0.6 * batch_clicks < realtime < batch_clicks  # ~20% late
    first = pq.read_table(parts[0])
    assert {"request_id", "ts", "item", "position", "affinity", "clicked"} <= set(first.column_names)
    assert len({e["request_id"] for e in events}) == len(events)


def test_converter_refuses_a_bad_late_fraction(tmp_path):
    with pytest.raises(PublicLogError, match="late-fraction"):
        convert(tmp_path, late_fraction=1.5)


def test_eval_runs_over_the_packaged_log(converted, tmp_path):
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            str(SPEC),
            "--data",
            str(converted.out),
            "--modes",
            "mtrm",
            "--seeds",
            "0",
            "--out",
            str(out),
            "--start",
            "2019-11-24T00:00:00Z",
            "--end",
            "2019-11-25T02:00:00Z",
            "--eval-from",
            "2019-11-25T00:00:00Z",
            "-q",
        ]
    )
    assert code == 0
    modes = json.loads((out / "report.json").read_text())["modes"]
    assert set(modes) == {"mtrm"}
    for entry in modes.values():
        assert entry["samples"] > 0 and entry["logloss"] > 0
        assert entry["steps"]["batch"] > 0 and entry["steps"]["stream"] > 0
