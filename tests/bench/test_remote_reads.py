"""bench/remote_reads.py end to end on a small window: every contender reads every row through the
latency proxy and on loopback, and the last line is the JSON the docs quote."""

from __future__ import annotations

import pytest

from tests.bench.helpers import run_bench

pytestmark = pytest.mark.slow


def test_the_remote_reads_bench_reads_the_window_every_way(tmp_path):
    got = run_bench("remote_reads", tmp_path, 300, BENCH_REMOTE_ROWS="150000", BENCH_REMOTE_RUNS="1")
    assert got["bench"] == "remote_reads" and got["rows"] == 150000 and got["shards"] == 3
    for phase in ("latency", "loopback"):
        assert set(got[phase]["wall_s"]) == {"ours", "pyarrow_dataset", "pyarrow_files"}
    # a manifest (HEAD + GET), then a HEAD and one GET a shard: latency is paid per request
    assert got["latency"]["requests"]["ours"] == 2 + 2 * 3
    assert got["ratio"] > 0 and got["ratio_vs_pyarrow_files"] > 0
