"""`primus eval` end to end on a tiny world, and `primus train` CLI errors."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from primus_lib.cli.main import main
from primus_lib.evaluation.backtest import BASE_MODES, COMPLETE, RunConfig
from tests.train.conftest import START


def test_eval_writes_report_for_every_mode(tiny, tmp_path, capsys):
    spec, _ = tiny
    out = tmp_path / "out"
    code = main(
        [
            "eval",
            str(spec),
            "--seeds",
            "0,1",
            "--out",
            str(out),
            "--eval-from",
            "2026-11-01T03:00:00Z",
            "--ablations",
            "mtrm[corr=none,serve=memory]",
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    modes = report["modes"]
    assert set(modes) == {
        "mtrm",
        "single_tower",
        "offline",
        "online",
        "offline_then_online",
        "mtrm[corr=none,serve=memory]",
    }
    for entry in modes.values():
        assert 0.0 < entry["auc"] < 1.0 and entry["logloss"] > 0 and entry["samples"] > 0
        assert len(entry["auc_per_seed"]) == 2 and entry["auc_std"] > 0  # the seeds differ
    assert modes["offline"]["steps"]["stream"] == 0 and modes["online"]["steps"]["batch"] == 0
    assert modes["mtrm"]["steps"]["batch"] > 0 and modes["mtrm"]["steps"]["stream"] > 0
    # scored windows: 03:00, 04:00, 05:00, each with every mode
    assert [w["window"] for w in report["windows"]] == ["20261101T030000Z", "20261101T040000Z", "20261101T050000Z"]
    assert all("mtrm" in w and "offline" in w for w in report["windows"])
    assert (out / "auc.png").stat().st_size > 1000
    table = capsys.readouterr().out
    assert "mtrm - single_tower" in table and "offline_then_online" in table


def test_model_seed_offset_draws_another_start_on_the_same_data(tiny, tmp_path, capsys):
    """--model-seed-offset N: seed s is scored on seed s's data with the model of seed s + N."""
    spec, _ = tiny
    common = [str(spec), "--modes", "single_tower", "--eval-from", "2026-11-01T03:00:00Z", "-q"]
    assert main(["eval", *common, "--seeds", "0", "--model-seed-offset", "7", "--out", str(tmp_path / "a")]) == 0
    assert main(["eval", *common, "--seeds", "7", "--out", str(tmp_path / "b")]) == 0
    assert main(["eval", *common, "--seeds", "0", "--out", str(tmp_path / "c")]) == 0
    shifted, seven, zero = (json.loads((tmp_path / d / "report.json").read_text()) for d in "abc")
    assert shifted["model_seed_offset"] == 7 and zero["model_seed_offset"] == 0
    assert shifted["modes"]["single_tower"]["seeds"] == [0]
    assert shifted["modes"]["single_tower"]["auc"] == seven["modes"]["single_tower"]["auc"]
    assert shifted["modes"]["single_tower"]["auc"] != zero["modes"]["single_tower"]["auc"]
    capsys.readouterr()
    assert main(["eval", *common, "--seeds", "0", "--model-seed-offset", "-1", "--out", str(tmp_path / "d")]) == 2
    assert "--model-seed-offset: -1: expected a whole number >= 0" in capsys.readouterr().err


def _flip_labels(table: pa.Table, label: str) -> pa.Table:
    """The same rows with the training label inverted (0 <-> 1)."""
    column = table.column(label)
    flipped = pc.if_else(pc.equal(column, 0), 1, 0).cast(column.type)
    return table.set_column(table.column_names.index(label), label, flipped)


@pytest.mark.parametrize("mode", BASE_MODES)
def test_progressive_validation_scores_a_window_before_training_on_it(tiny, mode):
    """Window k is scored before any of its rows is trained on: poisoning the training labels of
    hour k (its stream rows and its batch window; the label it is scored against is kept) leaves
    its score unchanged, and changes the score of a later window (the poison is trained on)."""
    from primus_lib.evaluation.backtest import load_timeline, run_one

    _, job = tiny
    k = 2  # the first scored window (also offline_then_online's switch)
    data = Path(job.spec.dataset.streams[1].sources[0].uri.removeprefix("file://")).parent.parent
    clean = load_timeline(job, data, START, START + timedelta(hours=6), START + timedelta(hours=k))
    assert clean.eval_from == k and clean.switch == k
    label = job.spec.features.label
    stream, batch = list(clean.stream), list(clean.batch)
    stream[k], batch[k] = _flip_labels(stream[k], label), _flip_labels(batch[k], label)
    poisoned = dataclasses.replace(clean, stream=stream, batch=batch)
    assert stream[k].column(COMPLETE).equals(clean.stream[k].column(COMPLETE))

    config = RunConfig.parse(mode)
    a, b = run_one(job, clean, config, 0), run_one(job, poisoned, config, 0)
    assert [w["window"] for w in a.windows] == [w["window"] for w in b.windows]
    assert a.windows[0]["window"] == "20261101T020000Z"
    score = lambda w: (w["samples"], w["auc"], w["logloss"])  # noqa: E731
    assert score(a.windows[0]) == score(b.windows[0])  # scored before the poisoned rows were trained on
    assert any(score(x) != score(y) for x, y in zip(a.windows[1:], b.windows[1:], strict=True)), (
        "the poisoned hour never reached training: this test could not see a leak"
    )


def test_later_data_does_not_change_earlier_scores(tiny):
    """A run truncated right after window k scores windows <= k exactly as the full run does, and
    the label scored against is the complete one (clicks the stream missed included)."""
    from primus_lib.evaluation.backtest import load_timeline, run_one

    _, job = tiny
    data = Path(job.spec.dataset.streams[1].sources[0].uri.removeprefix("file://")).parent.parent
    full = load_timeline(job, data, START, START + timedelta(hours=6), START + timedelta(hours=3))
    short = load_timeline(job, data, START, START + timedelta(hours=4), START + timedelta(hours=3))
    config = RunConfig.parse("mtrm")
    a, b = run_one(job, full, config, 0), run_one(job, short, config, 0)
    assert [w["window"] for w in b.windows] == ["20261101T030000Z"]
    assert a.windows[0]["window"] == "20261101T030000Z"
    assert a.windows[0]["auc"] == b.windows[0]["auc"] and a.windows[0]["logloss"] == b.windows[0]["logloss"]
    complete = full.stream[3].column(COMPLETE).to_numpy()
    realtime = full.stream[3].column("clicked").to_numpy()
    assert (complete >= realtime).all() and complete.sum() > realtime.sum()


def test_run_config_parsing():
    config = RunConfig.parse("mtrm[adapt=128-64,lr=0.003,serve=adapt,corr=none]")
    assert (config.mode, config.adapt, config.lr, config.serve, config.corr) == (
        "mtrm",
        [128, 64],
        0.003,
        "adapt",
        "none",
    )
    assert RunConfig.parse("online[c=oracle]").c == "oracle" and RunConfig.parse("online[c=0.8]").c == 0.8
    assert RunConfig.parse("single_tower[reread=1]").reread is True and RunConfig.parse("single_tower").reread is None
    with pytest.raises(ValueError, match="unknown key"):
        RunConfig.parse("mtrm[bogus=1]")
    with pytest.raises(ValueError, match="lr='fast' is not a valid value"):
        RunConfig.parse("mtrm[lr=fast]")
    with pytest.raises(ValueError, match="MODE"):
        RunConfig.parse("twotower")


def test_oracle_completeness_is_the_share_of_clicks_the_stream_label_sees(tiny):
    from primus_lib.evaluation.backtest import load_timeline, oracle_completeness

    _, job = tiny
    data = Path(job.spec.dataset.streams[1].sources[0].uri.removeprefix("file://")).parent.parent
    timeline = load_timeline(job, data, START, START + timedelta(hours=6), START + timedelta(hours=2))
    realtime = sum(pc.sum(t.column("clicked")).as_py() or 0 for t in timeline.stream)
    complete = sum(pc.sum(t.column(COMPLETE)).as_py() or 0 for t in timeline.stream)
    assert oracle_completeness(job, timeline) == pytest.approx(realtime / complete) and 0.5 < realtime / complete < 1


def test_a_capacity_leaves_rows_in_the_buffers_for_later_hours(tiny):
    """--capacity: the world moves to the next hour once that many rows were trained, so the trainer
    falls behind the data; with all that arrived (no capacity) it keeps up hour by hour."""
    from primus_lib.evaluation.backtest import load_timeline, run_one

    _, job = tiny
    data = Path(job.spec.dataset.streams[1].sources[0].uri.removeprefix("file://")).parent.parent
    timeline = load_timeline(job, data, START, START + timedelta(hours=6), START + timedelta(hours=2))
    config = RunConfig.parse("mtrm")
    full, slow = run_one(job, timeline, config, 0), run_one(job, timeline, config, 0, capacity=64)
    assert [w["samples"] for w in full.windows] == [w["samples"] for w in slow.windows]  # the same rows scored
    assert sum(slow.steps.values()) < sum(full.steps.values()) and slow.windows != full.windows
    assert sum(full.steps.values()) * 64 >= sum(w.num_rows for w in timeline.batch) // 2  # it trained everything


def test_train_cli_rejects_bad_arguments(tiny, capsys):
    spec, _ = tiny
    assert main(["train", str(spec), "--until-window", "yesterday"]) == 2
    assert "--until-window: expected a window id like 20261101T000000Z, got 'yesterday'" in capsys.readouterr().err
    assert main(["train", str(spec), "--mode", "hybrid"]) == 2


def test_resent_late_clicks_are_trained_on_not_scored(tmp_path, monkeypatch):
    """A world that re-sends late clicks on the stream scores the same impressions against the same
    complete labels as the plain world; the re-sent clicks (label 1) only add training rows."""
    from primus_lib.data.datagen import WorldConfig, generate
    from primus_lib.data.schema import RESENT_CLICK_SUFFIX
    from primus_lib.evaluation.backtest import load_timeline, run_one
    from tests.train.conftest import make_job

    end = START + timedelta(hours=6)
    generate(
        tmp_path / "late" / "data", START, end, rows_per_hour=150, seed=7, config=WorldConfig(late_click_events=True)
    )
    _, late_job = make_job(tmp_path / "late", monkeypatch)
    late = load_timeline(late_job, None, START, end, START + timedelta(hours=2))
    (tmp_path / "plain").mkdir()
    _, plain_job = make_job(tmp_path / "plain", monkeypatch)
    plain = load_timeline(plain_job, None, START, end, START + timedelta(hours=2))

    resent_rows = 0
    for hour, (a, b) in enumerate(zip(late.stream, plain.stream, strict=True)):
        resent = pc.ends_with(a.column("request_id"), RESENT_CLICK_SUFFIX)
        extra = a.filter(resent)
        assert extra.column(COMPLETE).null_count == extra.num_rows, f"hour {hour}: a re-sent click would be scored"
        assert extra.column("clicked").to_pylist() == [1] * extra.num_rows
        kept = a.filter(pc.invert(resent)).sort_by("request_id")
        assert kept.column("request_id").equals(b.sort_by("request_id").column("request_id"))
        assert kept.column(COMPLETE).equals(b.sort_by("request_id").column(COMPLETE))
        resent_rows += extra.num_rows
    assert resent_rows > 0

    config = RunConfig.parse("online")
    a, b = run_one(late_job, late, config, 0), run_one(plain_job, plain, config, 0)
    assert [(w["window"], w["samples"]) for w in a.windows] == [(w["window"], w["samples"]) for w in b.windows]
    assert a.windows != b.windows  # the re-sent clicks were trained on


@pytest.mark.parametrize("keep", [False, True])
def test_generated_world_data_is_removed_after_the_report_unless_kept(tmp_path, keep):
    """A grid over many worlds filled a disk with their data (~0.3 GB a seed): it goes once scored."""
    out = tmp_path / "out"
    args = ["eval", "config/jobs/worlds-eval.yaml", "--data-seeds", "--seeds", "0", "--rows-per-hour", "40"]
    args += ["--end", "2026-11-01T05:00:00Z", "--eval-from", "2026-11-01T03:00:00Z"]
    args += ["--modes", "single_tower", "--world", "delay_median_minutes=30", "--out", str(out), "-q"]
    assert main([*args, *(["--keep-data"] if keep else [])]) == 0
    assert json.loads((out / "report.json").read_text())["modes"]["single_tower"]["samples"] > 0
    assert (out / "data" / "seed-0" / "stream" / "events.jsonl").exists() == keep
