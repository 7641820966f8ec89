"""A committed window read back from S3, as a trainer on another host reads it: ours against pyarrow.

The window (``BENCH_REMOTE_ROWS`` rows, 1 M by default, in shards of 65,536: the executor's) is
committed to a real S3 store (SeaweedFS, ``weed mini``) by ``write_window``. Each contender then
reads every row of it through ``devstack/http_latency.py`` with 10 ms a request (the DTGG
benchmark's model of remote storage: a request's answer leaves 10 ms after the store gave it), and
on loopback without it:

- ours: ``read_window`` (the manifest, then each shard in order with its size and sha256 checked:
  what the trainer's batch feeds do a shard at a time, ``feeds.py``);
- ``pyarrow_dataset``: ``pyarrow.dataset`` over the same shard files (named to it: no listing), read
  with its threads (IPC format, ``to_table``): no checksum, no manifest;
- ``pyarrow_files``: each shard opened with pyarrow's S3 filesystem for random access and read whole,
  in order: the plain sequential reader, no checks.

``ratio``: ours / ``pyarrow_dataset`` in rows per second through the latency (the less favourable
peer: it reads in parallel, ours in order); ``ratio_vs_pyarrow_files`` beside it, and the loopback
figures. Best of RUNS, contenders interleaved. Also: HTTP requests each read took.
Run: .venv/bin/python bench/remote_reads.py  (last line: one JSON object)
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402

from devstack import seaweedfs  # noqa: E402
from devstack.http_latency import HttpLatencyProxy  # noqa: E402
from devstack.proc import stop  # noqa: E402
from tests.fixtures.s3 import S3Server  # noqa: E402

ROWS = int(os.environ.get("BENCH_REMOTE_ROWS", 1_000_000))
RUNS = int(os.environ.get("BENCH_REMOTE_RUNS", 3))
SHARD = 65_536
LATENCY_S = 0.010
KEYS = ("bench", "bench-secret")
WINDOW = "bench/jobs/windows/history/w"


def sample(rows: int) -> pa.Table:
    """The bench/executor.py window's columns after the join: ids, hashed sparse ids, dense, label."""
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "request_id": pa.array([f"r{i % 8}-{i // 8}" for i in range(rows)]),
            "user_id": rng.integers(0, 1 << 20, rows),
            "item_id": rng.integers(0, 1 << 20, rows),
            "category": rng.integers(0, 512, rows),
            "price": rng.random(rows, np.float32) * 100,
            "age": rng.random(rows, np.float32) * 60,
            "ts": rng.integers(0, 3_600_000, rows),
            "clicked": (rng.random(rows) < 0.3).astype(np.float32),
        }
    )


def store(port: int) -> S3Server:
    """The store at ``port`` (SeaweedFS itself or the latency proxy in front of it), the tests' way."""
    return S3Server(f"127.0.0.1:{port}", *KEYS)


def as_default_store(port: int, secrets: Path) -> None:
    """The store at ``port`` as this process's default storage connection (how ``primus train`` gets it)."""
    os.environ.update(store(port).env(secrets))


def ours() -> int:
    from primus_lib.data.shards import read_window
    from primus_lib.storage import locate

    return read_window(locate(f"s3://{WINDOW}")).num_rows


def pyarrow_dataset(port: int, files: list[str]) -> int:
    return ds.dataset(files, format="ipc", filesystem=store(port).filesystem()).to_table().num_rows


def pyarrow_files(port: int, files: list[str]) -> int:
    fs, rows = store(port).filesystem(), 0
    for path in files:
        with fs.open_input_file(path) as handle:
            rows += pa.ipc.open_file(handle.read_buffer()).read_all().num_rows
    return rows


def main() -> None:
    from primus_lib.data.shards import read_manifest, write_window
    from primus_lib.storage import locate

    work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    mini = seaweedfs.weed_mini(work / "weed", *KEYS, seaweedfs.weed_binary() or "weed", identity="bench")
    proc = mini.start()
    proxy = HttpLatencyProxy(mini.s3_port, LATENCY_S)
    try:
        store(mini.s3_port).filesystem().create_dir("bench")
        as_default_store(mini.s3_port, work / "secrets-direct")
        write_window(locate(f"s3://{WINDOW}"), sample(ROWS), stream="history", window="w", seed=1, rows_per_shard=SHARD)
        manifest = read_manifest(locate(f"s3://{WINDOW}"))
        assert manifest is not None
        files = [f"{WINDOW}/{s.file}" for s in manifest.shards]
        result: dict = {"bench": "remote_reads", "rows": ROWS, "shards": len(files), "latency_ms": LATENCY_S * 1000}
        for name, port in (("latency", proxy.port), ("loopback", mini.s3_port)):
            as_default_store(port, work / f"secrets-{name}")
            contenders: dict[str, Callable[[], int]] = {
                "ours": ours,
                "pyarrow_dataset": functools.partial(pyarrow_dataset, port, files),
                "pyarrow_files": functools.partial(pyarrow_files, port, files),
            }
            walls: dict[str, list[float]] = {k: [] for k in contenders}
            requests: dict[str, int] = {}
            for run in range(RUNS):
                order = list(contenders) if run % 2 == 0 else list(contenders)[::-1]
                for contender in order:
                    before, began = proxy.requests, time.perf_counter()
                    assert contenders[contender]() == ROWS, contender
                    walls[contender].append(time.perf_counter() - began)
                    requests[contender] = proxy.requests - before
            best = {k: min(v) for k, v in walls.items()}
            figures = {
                "wall_s": {k: round(v, 4) for k, v in best.items()},
                "wall_s_all": {k: sorted(round(x, 4) for x in v) for k, v in walls.items()},
                "ratio_vs_pyarrow_dataset": round(best["pyarrow_dataset"] / best["ours"], 3),
                "ratio_vs_pyarrow_files": round(best["pyarrow_files"] / best["ours"], 3),
            }
            if name == "latency":
                figures["requests"] = requests
                result["ratio"] = figures["ratio_vs_pyarrow_dataset"]
                result["ratio_vs_pyarrow_files"] = figures["ratio_vs_pyarrow_files"]
            result[name] = figures
        result["measured"] = "wall seconds, best of the runs; ratios = ours / theirs in rows per second"
        print(json.dumps(result))
    finally:
        proxy.close()
        stop(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
