"""bench/executor.py end to end on a small window (2,000 rows a file, one run): every contender, per
process (forked from a warm Airflow worker, and spawned) and in one process, commits the same rows,
and the last line is the JSON the docs quote. It runs the fork path as Airflow's LocalExecutor does,
which no other test does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_the_executor_bench_runs_every_contender_the_three_ways(tmp_path):
    env = {**os.environ, "BENCH_EXECUTOR_ROWS": "2000", "BENCH_EXECUTOR_RUNS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "executor.py")], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["bench"] == "executor" and got["rows"] == 8 * 2000
    for figures in (got, got["per_process_spawned"], got["in_process"]):
        assert set(figures["wall_s"]) == {"ours", "floor", "pandas", "polars", "duckdb"}
        assert set(figures["wall_s_2t"]) == {"ours", "floor", "polars", "duckdb"}
        ratios = [v for k, v in figures.items() if k.startswith("ratio_vs_")]
        assert len(ratios) == 7 and all(r > 0 for r in ratios), figures
