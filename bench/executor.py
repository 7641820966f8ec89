"""Batch data-executor throughput: read -> decode -> join -> shuffle -> shard write of one window.

Ours: execute_task for every data task (parquet read of the needed columns, decode: timestamp
normalisation, sparse id hashing, casts; staged as Arrow IPC) then join_window (left join of
impressions and clicks, fill, seeded shuffle, fixed-size IPC shards, atomic manifest).
Floor: raw pyarrow read of the same files plus an IPC write of what was read.
Baseline: a straightforward pandas version of the same pipeline (read_parquet, merge, fillna,
hash_pandas_object for the ids, sample(frac=1), shards written through pyarrow).
Everything runs on one core (pyarrow's thread pools set to 1). Prints one JSON line last.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_lib.data.dtgg import plan_source
from primus_lib.data.executor import execute_task, join_window
from primus_lib.data.shards import read_window
from primus_lib.paths import JobPaths
from tests.data.helpers import T0, job_doc, make_job

FILES, ROWS = 8, 125_000


def make_data(root: Path) -> int:
    rng = np.random.default_rng(0)
    hour = f"{T0:%Y%m%d}/{T0:%H}"
    for source in ("impressions", "clicks"):
        (root / source / hour).mkdir(parents=True)
    base = int(T0.timestamp() * 1000)
    for f in range(FILES):
        ids = pa.array([f"r{f}-{i}" for i in range(ROWS)])
        imp = pa.table({
            "request_id": ids, "user_id": rng.integers(0, 10**7, ROWS), "item_id": rng.integers(0, 10**6, ROWS),
            "category": rng.integers(0, 500, ROWS), "price": rng.random(ROWS) * 100, "age": rng.random(ROWS) * 60,
            "ts": base + rng.integers(0, 3_600_000, ROWS),
        })  # fmt: skip
        keep = np.flatnonzero(rng.random(ROWS) < 0.3)
        clk = pa.table({"request_id": ids.take(pa.array(keep)), "clicked": np.ones(len(keep), np.int64)})
        pq.write_table(imp, root / "impressions" / hour / f"part-{f:03d}.parquet")
        pq.write_table(clk, root / "clicks" / hour / f"part-{f:03d}.parquet")
    for source in ("impressions", "clicks"):
        (root / source / hour / "_SUCCESS").touch()
    return FILES * ROWS


def ours(job) -> tuple[float, int]:
    began = time.perf_counter()
    for source in ("impressions", "clicks"):
        for task in plan_source(job, "history", source, T0):
            execute_task(job, task)
    manifest = join_window(job, "history", T0)
    return time.perf_counter() - began, manifest.rows


def floor(data: Path, out: Path) -> float:
    out.mkdir()
    began = time.perf_counter()
    for i, path in enumerate(sorted(data.rglob("*.parquet"))):
        table = pq.read_table(path, use_threads=False)
        with pa.OSFile(str(out / f"{i}.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    return time.perf_counter() - began


def with_pandas(job, data: Path, out: Path) -> tuple[float, int]:
    features = job.spec.features
    began = time.perf_counter()
    hour = f"{T0:%Y%m%d}/{T0:%H}"
    imp = pd.concat(
        [pd.read_parquet(p) for p in sorted((data / "impressions" / hour).glob("*.parquet"))], ignore_index=True
    )
    clk = pd.concat([pd.read_parquet(p) for p in sorted((data / "clicks" / hour).glob("*.parquet"))], ignore_index=True)
    imp["ts"] = imp["ts"].astype("int64")
    for f in features.sparse:
        imp[f.name] = (pd.util.hash_pandas_object(imp[f.name], index=False) % f.buckets).astype("int64")
    for name in features.dense:
        imp[name] = imp[name].fillna(0).astype("float32")
    df = imp.merge(clk, on="request_id", how="left")
    df["clicked"] = df["clicked"].fillna(0).astype("float32")
    df = df.sample(frac=1.0, random_state=7).reset_index(drop=True)
    df = df[["request_id", "clicked", "ts", *(f.name for f in features.sparse), *features.dense]]
    out.mkdir()
    for i, start in enumerate(range(0, len(df), 65536)):
        table = pa.Table.from_pandas(df.iloc[start : start + 65536], preserve_index=False)
        with pa.OSFile(str(out / f"part-{i:05d}.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    return time.perf_counter() - began, len(df)


def main() -> None:
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    work = Path(tempfile.mkdtemp(prefix="bench-executor-"))
    try:
        data = work / "data"
        rows = make_data(data)
        doc = job_doc(f"file://{data}", hours=1)
        doc["spec"]["dataset"]["streams"][0]["rows_per_shard"] = 65536
        results = {"ours": [], "floor": [], "pandas": []}
        for run in range(3):
            job = make_job(doc, work / f"job{run}")
            seconds, out_rows = ours(job)
            assert out_rows == rows
            results["ours"].append(seconds)
            results["floor"].append(floor(data, work / f"floor{run}"))
            seconds, pandas_rows = with_pandas(job, data, work / f"pandas{run}")
            assert pandas_rows == rows
            results["pandas"].append(seconds)
        table = read_window(JobPaths.for_job(job).window_dir("history", T0))
        clicked = float(pa.compute.sum(table.column("clicked")).as_py())
        best = {k: min(v) for k, v in results.items()}
        rate = {k: rows / v for k, v in best.items()}
        result = {
            "bench": "executor", "rows": rows, "files": FILES * 2, "cores": 1,
            "ours_rows_per_s_per_core": round(rate["ours"]), "floor_rows_per_s_per_core": round(rate["floor"]),
            "pandas_rows_per_s_per_core": round(rate["pandas"]),
            "ours_s": round(best["ours"], 3), "floor_s": round(best["floor"], 3), "pandas_s": round(best["pandas"], 3),
            "ratio": round(rate["ours"] / rate["floor"], 3), "ratio_vs_floor": round(rate["ours"] / rate["floor"], 3),
            "ratio_vs_pandas": round(rate["ours"] / rate["pandas"], 2), "clicked_rows": clicked,
        }  # fmt: skip
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
