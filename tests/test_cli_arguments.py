"""The commands refuse a count or duration out of range, and a role or stream the job lacks, in one
line and exit 2 before anything runs (``primus_lib/cli/arguments.py``)."""

from __future__ import annotations

import argparse

import pytest

from primus_lib.cli.arguments import duration, integer
from primus_lib.cli.main import main
from tests.fixtures.specs import demo_doc, write_spec


def test_integer_and_duration_bounds():
    assert integer(1)("3") == 3 and integer(0, 65535)("0") == 0
    for parse, text in [(integer(1), "0"), (integer(1), "-1"), (integer(1), "2.5"), (integer(0, 65535), "65536")]:
        with pytest.raises(argparse.ArgumentTypeError, match=f"got '{text}'"):
            parse(text)
    assert duration(zero=True)("0") == 0.0 and duration(zero=False)("0.5") == 0.5
    for parse, text in [(duration(zero=False), "0"), (duration(zero=True), "-1"), (duration(zero=True), "nan")]:
        with pytest.raises(argparse.ArgumentTypeError, match="expected a number of seconds"):
            parse(text)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["train", "{spec}", "--max-steps", "-1"], "argument --max-steps: expected an integer >= 1, got '-1'"),
        (["train", "{spec}", "--poll-interval", "0"], "argument --poll-interval: expected a number of seconds > 0"),
        (["resources", "scale", "{spec}", "--role", "trainer", "--replicas", "-2"], "expected an integer >= 0"),
        (["executor", "{spec}", "--port", "70000"], "argument --port: expected an integer from 0 to 65535"),
        (["eval", "{spec}", "--out", "{tmp}/out", "--threads", "0"], "argument --threads: expected an integer >= 1"),
        (["plan", "{spec}", "--threads", "0"], "argument --threads: expected an integer >= 1, got '0'"),
    ],
)
def test_a_number_out_of_range_is_refused_by_the_parser(tmp_path, capsys, argv, says):
    spec = write_spec(tmp_path / "job.yaml", demo_doc("file:///srv/ctr", hours=2))
    with pytest.raises(SystemExit) as exit_:
        main([a.format(spec=spec, tmp=tmp_path) for a in argv])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_training_flags_name_what_they_expect(tmp_path, capsys):
    spec = str(write_spec(tmp_path / "job.yaml", demo_doc("file:///srv/ctr", hours=2)))
    assert main(["train", spec, "--switch-at", "soon"]) == 2
    assert capsys.readouterr().err.strip() == (
        "primus train: --switch-at: expected an ISO instant like 2026-11-01T00:00:00Z, got 'soon'"
    )
    assert main(["train", spec, "--until-window", "2026-11-01"]) == 2
    assert capsys.readouterr().err.strip() == (
        "primus train: --until-window: expected a window id like 20261101T000000Z, got '2026-11-01'"
    )


def test_a_role_the_job_lacks_is_refused_before_the_backend_is_asked(tmp_path, capsys):
    spec = str(write_spec(tmp_path / "job.yaml", demo_doc("file:///srv/ctr", hours=2)))
    assert main(["resources", "scale", spec, "--role", "bogus", "--replicas", "2"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("primus resources scale: --role: expected a role of job 'ctr-demo' (") and line.endswith(
        "), got 'bogus'"
    )


def test_eval_refuses_a_world_without_the_data_it_generates(tmp_path, capsys):
    spec = str(write_spec(tmp_path / "job.yaml", demo_doc("file:///srv/ctr", hours=2)))
    assert main(["eval", spec, "--world", "late-heavy", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        "primus eval: --world 'late-heavy': expected with --data-seeds (it generates the world's data)"
    )
    assert not (tmp_path / "out").exists()
