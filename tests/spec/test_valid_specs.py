from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from primus_lib.spec import SpecError, load_job, parse_job
from primus_lib.spec.units import format_duration, parse_duration, parse_quantity

ROOT = Path(__file__).resolve().parents[2]
JOBS = sorted((ROOT / "config" / "jobs").glob("*.yaml"))


@pytest.mark.parametrize("spec", JOBS, ids=[p.stem for p in JOBS])
def test_example_specs_validate(spec: Path):
    job = load_job(spec, env={"PRIMUS_DATA": "/data"})
    assert job.kind == "PrimusJob"
    assert job.spec.resources.roles["trainer"]


def test_demo_spec_fields_and_env_expansion():
    job = load_job(ROOT / "config/jobs/ctr-demo.yaml", env={"PRIMUS_DATA": "/srv/ctr"})
    history = job.stream("history")
    assert history.sources[0].uri == "file:///srv/ctr/impressions/{YYYY}{MM}{DD}/{HH}/"
    assert history.lag == timedelta(hours=24)
    assert history.join.fill == {"clicked": 0}
    assert job.stream("realtime").sources[0].kafka.startup == "earliest"
    assert job.spec.training.priority == {"history": 1.0, "realtime": 4.0}
    assert job.spec.resources.roles["data_executor"].memory == 2 * 2**30
    assert job.spec.scaling.horizontal.cooldown == timedelta(seconds=60)
    assert job.spec.timer.window_size == timedelta(hours=1)


def test_unset_env_is_an_error_at_run_time_and_a_warning_for_validate():
    with pytest.raises(SpecError) as caught:
        load_job(ROOT / "config/jobs/ctr-demo.yaml", env={})
    assert "spec.dataset.streams[0].sources[0].uri: expected environment variable PRIMUS_DATA" in str(caught.value)
    warnings: list = []
    load_job(ROOT / "config/jobs/ctr-demo.yaml", env={}, warnings=warnings)
    assert [w.path for w in warnings] == [
        "spec.dataset.streams[0].sources[0].uri",
        "spec.dataset.streams[0].sources[1].uri",
    ]


def test_env_default_syntax():
    text = (ROOT / "config/jobs/ctr-demo.yaml").read_text().replace("${PRIMUS_DATA}", "${PRIMUS_DATA:-/fallback}")
    job = parse_job(text, env={})
    assert job.stream("history").sources[1].uri.startswith("file:///fallback/clicks/")


def test_yaml_syntax_error_names_line():
    with pytest.raises(SpecError) as caught:
        parse_job("spec: [unclosed\n", "bad.yaml")
    assert str(caught.value).startswith("bad.yaml: line ")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpecError) as caught:
        load_job(tmp_path / "nope.yaml")
    assert "nope.yaml: (file): expected a readable YAML file" in str(caught.value)


def test_cli_validate_examples_exit_zero():
    result = subprocess.run(
        [sys.executable, "-m", "primus_lib.cli.main", "validate", *map(str, JOBS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok: PrimusJob ") == len(JOBS)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("10m", 600), ("24h", 86400), ("1d", 86400), (30, 30), ("1.5h", 5400)]
)
def test_durations(text, seconds):
    assert parse_duration(text).total_seconds() == seconds


def test_duration_round_trip():
    for text in ("90s", "10m", "3h", "1d", "2w"):
        assert format_duration(parse_duration(text)) == text


@pytest.mark.parametrize(("text", "value"), [("500m", 0.5), (2, 2.0), ("4Gi", 4 * 2**30), ("1k", 1000.0)])
def test_quantities(text, value):
    assert parse_quantity(text) == value
