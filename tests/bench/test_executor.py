"""bench/executor.py end to end on a small window (2,000 rows a file, one run): every contender, per
process (forked from a warm Airflow worker, and spawned) and in one process, commits the same rows,
and the last line is the JSON the docs quote. It runs the fork path as Airflow's LocalExecutor does,
which no other test does."""

from __future__ import annotations

import pytest

from tests.bench.helpers import run_bench

pytestmark = pytest.mark.slow


def test_the_executor_bench_runs_every_contender_the_three_ways(tmp_path):
    got = run_bench("executor", tmp_path, 600, BENCH_EXECUTOR_ROWS="2000", BENCH_EXECUTOR_RUNS="1")
    assert got["bench"] == "executor" and got["rows"] == 8 * 2000
    for figures in (got, got["per_process_spawned"], got["in_process"]):
        assert set(figures["wall_s"]) == {"ours", "floor", "pandas", "polars", "duckdb"}
        assert set(figures["wall_s_2t"]) == {"ours", "floor", "polars", "duckdb"}
        ratios = [v for k, v in figures.items() if k.startswith("ratio_vs_")]
        assert len(ratios) == 7 and all(r > 0 for r in ratios), figures
