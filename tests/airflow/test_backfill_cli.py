from __future__ import annotations

import json

from primus_lib.cli.main import main
from tests.fixtures.airflow import JOB_SPEC


def _spec(tmp_path):
    path = tmp_path / "bf.yaml"
    path.write_text(JOB_SPEC.format(name="bf", start="2026-11-01T00:00:00Z", end="2026-11-01T04:00:00Z"))
    return str(path)


def test_dry_run_lists_the_windows_in_order_and_the_airflow_request(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path))
    assert (
        main(
            [
                "backfill",
                _spec(tmp_path),
                "--from",
                "2026-11-01T01:00Z",
                "--to",
                "2026-11-01T09:00Z",
                "--dry-run",
                "--mode",
                "skip",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in out if line.strip().startswith("window")] == [
        "2026-11-01T01:00:00Z",
        "2026-11-01T02:00:00Z",
        "2026-11-01T03:00:00Z",
    ]  # fmt: skip  (the timer ends at 04:00)
    request = json.loads(out[-1].removeprefix("request: "))
    assert request["from_date"] == "2026-11-01T01:00:00Z" and request["to_date"] == "2026-11-01T03:00:00Z"
    assert request["reprocess_behavior"] == "failed" and request["dag_run_conf"] == {"mode": "skip"}


def test_bad_ranges_are_refused_with_the_flag_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path))
    spec = _spec(tmp_path)
    assert main(["backfill", spec, "--from", "yesterday", "--to", "2026-11-01T02:00Z", "--dry-run"]) == 2
    assert "--from: expected an ISO instant" in capsys.readouterr().err
    assert main(["backfill", spec, "--from", "2026-11-01T02:00Z", "--to", "2026-11-01T01:00Z", "--dry-run"]) == 2
    assert "must be after --from" in capsys.readouterr().err
    assert main(["backfill", spec, "--from", "2026-12-01T00:00Z", "--to", "2026-12-02T00:00Z", "--dry-run"]) == 2
    assert "no window of job bf" in capsys.readouterr().err
