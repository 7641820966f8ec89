"""Every spec in tests/spec/invalid/ must fail with the exact field path and message it declares."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from primus_lib.spec import SpecError, load_job

CORPUS = sorted((Path(__file__).parent / "invalid").glob("*.yaml"))


def _expectations(path: Path) -> tuple[str, str]:
    lines = path.read_text().splitlines()
    expect_path = lines[0].removeprefix("# expect-path: ")
    expect = lines[1].removeprefix("# expect: ")
    return expect_path, expect


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 30


@pytest.mark.parametrize("spec", CORPUS, ids=[p.stem for p in CORPUS])
def test_invalid_spec_names_field_and_expectation(spec: Path):
    expect_path, expect = _expectations(spec)
    with pytest.raises(SpecError) as caught:
        load_job(spec, env={})
    lines = str(caught.value).splitlines()
    wanted = f"{spec}: {expect_path}: {expect}"
    assert any(line.startswith(wanted) for line in lines), f"no line starts with {wanted!r} in {lines}"
    for line in lines:  # the shape of every line: FILE: PATH: expected ..., found ...
        assert line.startswith(f"{spec}: ")
        assert ": expected " in line and ", found " in line


def test_cli_reports_every_invalid_spec_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "primus_lib.cli.main", "validate", *map(str, CORPUS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    for spec in CORPUS:
        expect_path, _ = _expectations(spec)
        assert f"{spec}: {expect_path}: expected" in result.stderr
    assert result.stdout == ""
