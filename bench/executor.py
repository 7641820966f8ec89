"""Batch data-executor throughput: read -> decode -> join -> shuffle -> shard write of one window.

Ours: execute_task for every data task (parquet read of the needed columns, decode: timestamp
normalisation, sparse id hashing, casts; staged as Arrow IPC) then join_window (left join of
impressions and clicks, fill, seeded shuffle, fixed-size IPC shards, atomic manifest).
Floor: raw pyarrow read of the same files plus an IPC write of what was read.
Baseline: a straightforward pandas version of the same pipeline (read_parquet, merge, fillna,
hash_pandas_object for the ids, sample(frac=1), shards written through pyarrow).
Everything runs on one core (pyarrow's thread pools set to 1); best of RUNS runs. Wall seconds
give the headline ratios (they include our commit's fsync waits); CPU seconds (process_time,
less sensitive to other load on a shared machine) and per-stage wall seconds (ours: read +
decode, stage write, read staged, join, shuffle, commit; pandas and floor likewise) are extra
figures. Prints one JSON line last.
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
RUNS = 5


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


class Clock:
    """Wall and CPU seconds of one run, plus named stage laps (wall)."""

    def __init__(self) -> None:
        self.wall0, self.cpu0, self.stages = time.perf_counter(), time.process_time(), {}
        self.last = self.wall0

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stages[name] = self.stages.get(name, 0.0) + now - self.last
        self.last = now

    def done(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall0, time.process_time() - self.cpu0


def ours(job) -> tuple[Clock, int]:
    clock = Clock()
    for source in ("impressions", "clicks"):
        for task in plan_source(job, "history", source, T0):
            execute_task(job, task, timings=clock.stages)
    manifest = join_window(job, "history", T0, timings=clock.stages)
    clock.wall, clock.cpu = clock.done()
    return clock, manifest.rows


def floor(data: Path, out: Path) -> Clock:
    out.mkdir()
    clock = Clock()
    for i, path in enumerate(sorted(data.rglob("*.parquet"))):
        table = pq.read_table(path, use_threads=False)
        clock.lap("read")
        with pa.OSFile(str(out / f"{i}.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        clock.lap("write")
    clock.wall, clock.cpu = clock.done()
    return clock


def with_pandas(job, data: Path, out: Path) -> tuple[Clock, int]:
    features = job.spec.features
    clock = Clock()
    hour = f"{T0:%Y%m%d}/{T0:%H}"
    imp = pd.concat(
        [pd.read_parquet(p) for p in sorted((data / "impressions" / hour).glob("*.parquet"))], ignore_index=True
    )
    clk = pd.concat([pd.read_parquet(p) for p in sorted((data / "clicks" / hour).glob("*.parquet"))], ignore_index=True)
    clock.lap("read")
    imp["ts"] = imp["ts"].astype("int64")
    for f in features.sparse:
        imp[f.name] = (pd.util.hash_pandas_object(imp[f.name], index=False) % f.buckets).astype("int64")
    for name in features.dense:
        imp[name] = imp[name].fillna(0).astype("float32")
    clock.lap("decode")
    df = imp.merge(clk, on="request_id", how="left")
    df["clicked"] = df["clicked"].fillna(0).astype("float32")
    clock.lap("join")
    df = df.sample(frac=1.0, random_state=7).reset_index(drop=True)
    df = df[["request_id", "clicked", "ts", *(f.name for f in features.sparse), *features.dense]]
    clock.lap("shuffle")
    out.mkdir()
    for i, start in enumerate(range(0, len(df), 65536)):
        table = pa.Table.from_pandas(df.iloc[start : start + 65536], preserve_index=False)
        with pa.OSFile(str(out / f"part-{i:05d}.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    clock.lap("write")
    clock.wall, clock.cpu = clock.done()
    return clock, len(df)


def main() -> None:
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    work = Path(tempfile.mkdtemp(prefix="bench-executor-"))
    try:
        data = work / "data"
        rows = make_data(data)
        doc = job_doc(f"file://{data}", hours=1)
        doc["spec"]["dataset"]["streams"][0]["rows_per_shard"] = 65536
        runs: dict[str, list[Clock]] = {"ours": [], "floor": [], "pandas": []}
        for run in range(RUNS):
            job = make_job(doc, work / f"job{run}")
            clock, out_rows = ours(job)
            assert out_rows == rows
            runs["ours"].append(clock)
            runs["floor"].append(floor(data, work / f"floor{run}"))
            clock, pandas_rows = with_pandas(job, data, work / f"pandas{run}")
            assert pandas_rows == rows
            runs["pandas"].append(clock)
        table = read_window(JobPaths.for_job(job).window_dir("history", T0))
        clicked = float(pa.compute.sum(table.column("clicked")).as_py())
        best = {k: min(c.wall for c in v) for k, v in runs.items()}
        cpu = {k: min(c.cpu for c in v) for k, v in runs.items()}
        rate = {k: rows / v for k, v in best.items()}
        stages = {k: {s: round(t, 3) for s, t in min(v, key=lambda c: c.wall).stages.items()} for k, v in runs.items()}
        result = {
            "bench": "executor", "rows": rows, "files": FILES * 2, "cores": 1, "runs": RUNS,
            "ours_rows_per_s_per_core": round(rate["ours"]), "floor_rows_per_s_per_core": round(rate["floor"]),
            "pandas_rows_per_s_per_core": round(rate["pandas"]),
            "ours_s": round(best["ours"], 3), "floor_s": round(best["floor"], 3), "pandas_s": round(best["pandas"], 3),
            "ratio": round(rate["ours"] / rate["floor"], 3), "ratio_vs_floor": round(rate["ours"] / rate["floor"], 3),
            "ratio_vs_pandas": round(rate["ours"] / rate["pandas"], 2),
            "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
            "ratio_vs_floor_cpu": round(cpu["floor"] / cpu["ours"], 3),
            "ratio_vs_pandas_cpu": round(cpu["pandas"] / cpu["ours"], 2),
            "stages_s": stages, "clicked_rows": clicked,
        }  # fmt: skip
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
