"""Progress of `primus datagen`, `primus eval` and `primus backfill --wait` on stderr: one plain line
per hour/window when stderr is not a terminal (as here: pytest captures it), a tqdm bar on one,
nothing with --quiet; results stay on stdout."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime

import pytest

from primus_lib.airflow_api import AirflowApi, AirflowApiError
from primus_lib.cli.backfill import WindowLines
from primus_lib.cli.console import Progress, seconds
from primus_lib.cli.main import main
from tests.fake_http import FakeHTTP
from tests.train.conftest import make_job


def test_plain_lines_count_the_steps_and_quiet_prints_nothing():
    out = io.StringIO()
    with Progress("job", 3, "window", stream=out) as progress:
        progress.advance("a")
        progress.skip()
        progress.advance("c")
        progress.status("loading")  # a bar's label only
        progress.note("a phase")
    assert out.getvalue().splitlines() == ["job [1/3] a", "job [3/3] c", "a phase"]
    quiet = io.StringIO()
    with Progress("job", 3, "window", stream=quiet, quiet=True) as progress:
        progress.advance("a")
        progress.note("a phase")
    assert quiet.getvalue() == "" and progress.done == 1


def test_a_terminal_gets_a_redrawn_bar_and_kept_lines():
    out = io.StringIO()
    with Progress("job", 2, "window", stream=out, tty=True) as progress:
        progress.status("loading")
        progress.advance("first", keep=True)
        progress.advance("second")
    text = out.getvalue()
    assert "job: loading" in text
    assert "\r" in text  # redrawn in place
    assert "job [1/2] first\n" in text  # a kept line stands above the bar
    assert "2/2" in text and "job [2/2] second" not in text


def test_durations_for_people():
    assert [seconds(4.25), seconds(185), seconds(3725), seconds(None)] == ["4.2s", "3m05s", "1h02m", "-"]


def test_datagen_prints_one_line_per_hour(tmp_path, monkeypatch, capsys):
    spec, _ = make_job(tmp_path, monkeypatch, hours=1, rows=10)
    argv = [
        "datagen",
        str(spec),
        "--out",
        str(tmp_path / "d"),
        "--start",
        "2026-11-01T00:00Z",
        "--end",
        "2026-11-01T03:00Z",
        "--rows-per-hour",
        "20",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["datagen", "[1/3]", "2026-11-01T00:00:00Z"],
        ["datagen", "[2/3]", "2026-11-01T01:00:00Z"],
        ["datagen", "[3/3]", "2026-11-01T02:00:00Z"],
    ]
    assert all(re.fullmatch(r"datagen \[\d/3\] \S+ \d+ rows", line) for line in lines)
    assert captured.out.startswith("wrote 3 hours")
    assert main([*argv, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.startswith("wrote 3 hours")


def test_eval_prints_a_line_per_mode_and_scored_window(tmp_path, monkeypatch, capsys):
    spec, _ = make_job(tmp_path, monkeypatch, hours=4, lag="1h", rows=80)
    argv = [
        "eval",
        str(spec),
        "--modes",
        "mtrm,offline",
        "--seeds",
        "0",
        "--out",
        str(tmp_path / "out"),
        "--eval-from",
        "2026-11-01T02:00:00Z",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    steps = [line for line in captured.err.splitlines() if line.startswith("eval [")]
    # 2 modes x 4 hours = 8 steps; hours 00:00 and 01:00 are warm-up (counted, no line)
    assert [line.split()[1:7] for line in steps] == [
        ["[3/8]", "mtrm", "seed", "0", "window", "2026-11-01T02:00:00Z"],
        ["[4/8]", "mtrm", "seed", "0", "window", "2026-11-01T03:00:00Z"],
        ["[7/8]", "offline", "seed", "0", "window", "2026-11-01T02:00:00Z"],
        ["[8/8]", "offline", "seed", "0", "window", "2026-11-01T03:00:00Z"],
    ]
    assert all(re.search(r" auc 0\.\d{4} logloss \d\.\d{4} \(\d+ samples\)$", line) for line in steps)
    assert len(captured.err.splitlines()) == len(steps)  # nothing else: a bad input stays one line
    # the per-run summaries and the table are results: stdout
    assert re.search(r"^  mtrm +seed 0: auc ", captured.out, re.M) and "eval [" not in captured.out
    assert main([*argv, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "offline" in captured.out


def _airflow(states: list[list[str | None]]):
    """A FAKE Airflow API whose three windows' runs move through ``states`` (one list per poll). The
    backfill itself is never marked complete (Airflow's scheduler does that every 30 s); the third
    window's run is one the backfill skipped, in flight (a scheduled run)."""
    polls = iter(states)
    dates = ["2026-11-01T01:00:00Z", "2026-11-01T02:00:00Z", "2026-11-01T03:00:00Z"]
    old = {"logical_date": "2026-10-31T23:00:00Z", "state": "failed", "run_type": "backfill"}  # an earlier backfill

    def answer(r):
        assert r.path.endswith("/dagRuns"), r.path  # the wait reads the windows' runs, never the backfill
        now = next(polls)
        runs = [
            {
                "logical_date": d,
                "state": s or "queued",
                "run_type": "scheduled" if d == dates[2] else "backfill",
                "start_date": "2026-11-30T10:00:00Z",
                "end_date": "2026-11-30T10:01:05Z" if s else None,
            }
            for d, s in zip(dates, now, strict=True)
        ]
        return 200, {"dag_runs": [old, *runs], "total_entries": 4}  # a server that ignored the bounds

    return FakeHTTP(answer)


def test_backfill_wait_prints_each_window_as_it_finishes_then_a_summary():
    http = _airflow(
        [[None, None, None], ["success", None, None], ["success", None, None], ["success", "failed", "success"]]
    )
    api = AirflowApi("http://af:8080", session=http.session())
    err = io.StringIO()
    first, last = datetime(2026, 11, 1, 1, tzinfo=UTC), datetime(2026, 11, 1, 3, tzinfo=UTC)
    with Progress("backfill", 3, "window", stream=err) as progress:
        lines = WindowLines(progress, first, last)
        windows = [first, datetime(2026, 11, 1, 2, tzinfo=UTC), last]
        runs = api.wait_backfill(7, "bf", windows, timeout=60, poll=0, on_poll=lines)
    # done at the poll that found every window's run final, though the backfill was never marked complete
    assert len(http.requests) == 4
    assert [r["logical_date"] for r in runs] == ["2026-11-01T01:00:00Z", "2026-11-01T02:00:00Z", "2026-11-01T03:00:00Z"]
    assert all(
        r.query["logical_date_gte"] == ["2026-11-01T01:00:00Z"]
        and r.query["logical_date_lte"] == ["2026-11-01T03:00:00Z"]
        for r in http.requests
    )  # only the windows' runs are asked for, not a long DAG's every run
    assert err.getvalue().splitlines() == [
        "backfill [1/3] window 2026-11-01T01:00:00Z success 1m05s",
        "backfill [2/3] window 2026-11-01T02:00:00Z failed 1m05s",
        "backfill [3/3] window 2026-11-01T03:00:00Z success 1m05s",
    ]  # the earlier backfill's run (outside the range) is not reported
    summary = lines.summary(7, "bf")
    assert summary.startswith("backfill 7 of bf: 3/3 windows finished, 2 success, 1 failed, in ")
    assert summary.endswith("; failed: 2026-11-01T02:00:00Z")
    assert lines.failed() == [datetime(2026, 11, 1, 2, tzinfo=UTC)]


def test_backfill_wait_times_out_naming_the_windows_without_a_run():
    http = _airflow([["success", None, "success"]])
    api = AirflowApi("http://af:8080", session=http.session())
    windows = [datetime(2026, 11, 1, h, tzinfo=UTC) for h in (1, 2, 3, 4)]  # 04:00 has no run
    with pytest.raises(AirflowApiError) as caught:
        api.wait_backfill(7, "bf", windows, timeout=0, poll=0)
    assert str(caught.value).startswith("backfill 7 of bf not finished after 0s: ")
    assert "'2026-11-01T02:00:00Z': 'queued'" in str(caught.value)
    assert str(caught.value).endswith("; no run for 2026-11-01T04:00:00Z")
