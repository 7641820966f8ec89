"""`make lint` inside the suite, so CI (which runs `make test`) fails on a lint, format or type error:
ruff's rules, ruff's layout and mypy on primus_lib and the plugin package (pyproject's [tool.mypy])."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import type_check

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SOURCES = ["primus_lib", "plugins", "dags", "tests", "bench", "devstack"]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("argv", [["check"], ["format", "--check"]], ids=["ruff-check", "ruff-format"])
def test_ruff_is_clean(argv: list[str]):
    done = run(str(BIN / "ruff"), *argv, *SOURCES)
    assert done.returncode == 0, f"ruff {' '.join(argv)} (exit {done.returncode}):\n{done.stdout}{done.stderr}"


def test_mypy_is_clean_on_the_packages():
    returncode, report = type_check.start().result()  # started at collection's end (tests/conftest.py)
    assert returncode == 0, f"mypy (exit {returncode}):\n{report}"
    checked = re.search(r"no issues found in (\d+) source files", report)
    assert checked and int(checked.group(1)) > 150, f"mypy checked too little (pyproject's files?): {report}"
