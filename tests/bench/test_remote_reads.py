"""bench/remote_reads.py end to end on a small window: every contender reads every row through the
latency proxy and on loopback, and the last line is the JSON the docs quote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_the_remote_reads_bench_reads_the_window_every_way(tmp_path):
    env = {**os.environ, "BENCH_REMOTE_ROWS": "150000", "BENCH_REMOTE_RUNS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "remote_reads.py")], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["bench"] == "remote_reads" and got["rows"] == 150000 and got["shards"] == 3
    for phase in ("latency", "loopback"):
        assert set(got[phase]["wall_s"]) == {"ours", "pyarrow_dataset", "pyarrow_files"}
    # a manifest (HEAD + GET), then a HEAD and one GET a shard: latency is paid per request
    assert got["latency"]["requests"]["ours"] == 2 + 2 * 3
    assert got["ratio"] > 0 and got["ratio_vs_pyarrow_files"] > 0
