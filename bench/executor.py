"""Batch data-executor throughput: read -> decode -> join -> shuffle -> shard write of one window.

Ours: execute_task for every data task (parquet read of the needed columns, decode: timestamp
normalisation, sparse id hashing, casts; staged as Arrow IPC; the per-task scaler metrics) then
join_window (left join of impressions and clicks, fill, seeded shuffle, fixed-size IPC shards
with sha256 + fsync, atomic manifest), under the data_executor role's allotment (its cpu = the
thread count, applied by ``primus_lib.resources.limits.enforced`` as the BatchExecutor does).
Floor: raw pyarrow read of the same files plus an IPC write of what was read.
Baselines, the same pipeline written plainly in each (shards written through pyarrow):
pandas (read_parquet, merge, fillna, hash_pandas_object, sample(frac=1)), Polars (lazy scan,
join, hash, shuffle), DuckDB (one SQL query: join, coalesce, hash, ORDER BY a seeded hash).
Each thread count (1, then 2) runs in its own process (Polars fixes its pool at import), with
pyarrow's pools, Polars and DuckDB set to it; pandas has one thread either way. Best of RUNS
runs, contenders interleaved so a noisy neighbour hits all of them. Wall seconds give the
headline ratios (ours / theirs, rows per second); CPU seconds and per-stage wall seconds
(ours: read_decode, stage, metrics summed over the task runners, then read, join, shuffle,
commit) are extra figures, as are the
costs of the guarantees measured on the committed window (``guarantees_s``: IPC encoding,
sha256 vs crc32, write without and with fsync; from ours' best run the staging round trip and the
per-task scaler metrics; and what 16 one-task processes would add entering their own allotment).
Prints one JSON line last.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_lib.data.dtgg import plan_source
from primus_lib.data.executor import execute_task, join_window
from primus_lib.data.executor.task import EXECUTOR_ROLE
from primus_lib.data.shards import read_window
from primus_lib.durable import fsync_path, ipc_bytes
from primus_lib.paths import JobPaths
from primus_lib.resources.limits import Limits, enforced
from tests.data.helpers import T0, job_doc, make_job

FILES, ROWS = 8, 125_000
RUNS = 5
SHARD = 65536
CONTENDERS = ("ours", "floor", "pandas", "polars", "duckdb")


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
    limits = Limits.for_role(job, EXECUTOR_ROLE)
    tasks = [task for source in ("impressions", "clicks") for task in plan_source(job, "history", source, T0)]
    # as BatchExecutor: one allotment for the executor, one task runner per allotted thread
    with enforced(limits, "bench executor", watch=False), ThreadPoolExecutor(limits.threads) as runners:
        list(runners.map(lambda task: execute_task(job, task, timings=clock.stages), tasks))
        manifest = join_window(job, "history", T0, timings=clock.stages)
    clock.wall, clock.cpu = clock.done()
    return clock, manifest.rows


def write_shards(table: pa.Table, out: Path, clock: Clock) -> None:
    out.mkdir()
    for i, start in enumerate(range(0, table.num_rows, SHARD)):
        part = table.slice(start, SHARD)
        with pa.OSFile(str(out / f"part-{i:05d}.arrow"), "wb") as sink, pa.ipc.new_file(sink, part.schema) as writer:
            writer.write_table(part)
    clock.lap("write")


def floor(data: Path, out: Path) -> Clock:
    out.mkdir()
    clock = Clock()
    for i, path in enumerate(sorted(data.rglob("*.parquet"))):
        table = pq.read_table(path, use_threads=pa.cpu_count() > 1)
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
    write_shards(pa.Table.from_pandas(df, preserve_index=False), out, clock)
    clock.wall, clock.cpu = clock.done()
    return clock, len(df)


def with_polars(job, data: Path, out: Path) -> tuple[Clock, int]:
    import polars as pl

    features = job.spec.features
    clock = Clock()
    hour = f"{T0:%Y%m%d}/{T0:%H}"
    imp = pl.scan_parquet(str(data / "impressions" / hour / "*.parquet"))
    clk = pl.scan_parquet(str(data / "clicks" / hour / "*.parquet"))
    sparse = [(pl.col(f.name).hash(7) % f.buckets).cast(pl.Int64).alias(f.name) for f in features.sparse]
    dense = [pl.col(n).fill_null(0).cast(pl.Float32) for n in features.dense]
    df = (
        imp.join(clk, on="request_id", how="left")
        .select(
            "request_id", pl.col("clicked").fill_null(0).cast(pl.Float32), pl.col("ts").cast(pl.Int64), *sparse, *dense
        )
        .collect()
    )
    clock.lap("join")
    df = df.sample(fraction=1.0, shuffle=True, seed=7)
    clock.lap("shuffle")
    write_shards(df.to_arrow(), out, clock)
    clock.wall, clock.cpu = clock.done()
    return clock, df.height


def with_duckdb(job, data: Path, out: Path, threads: int) -> tuple[Clock, int]:
    import duckdb

    features = job.spec.features
    clock = Clock()
    hour = f"{T0:%Y%m%d}/{T0:%H}"
    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    sparse = ", ".join(f"(hash(i.{f.name}) % {f.buckets})::BIGINT AS {f.name}" for f in features.sparse)
    dense = ", ".join(f"coalesce(i.{n}, 0)::FLOAT AS {n}" for n in features.dense)
    table = con.sql(f"""
        SELECT i.request_id, coalesce(c.clicked, 0)::FLOAT AS clicked, i.ts::BIGINT AS ts, {sparse}, {dense}
        FROM read_parquet('{data / "impressions" / hour}/*.parquet') i
        LEFT JOIN read_parquet('{data / "clicks" / hour}/*.parquet') c USING (request_id)
        ORDER BY hash(i.request_id, 7)""").to_arrow_table()  # fmt: skip
    con.close()
    clock.lap("join_shuffle")
    write_shards(table.combine_chunks(), out, clock)
    clock.wall, clock.cpu = clock.done()
    return clock, table.num_rows


def guarantees(table: pa.Table, out: Path) -> dict[str, float]:
    """Seconds each guarantee of the commit costs on the committed window's rows."""
    parts = [table.slice(s, SHARD) for s in range(0, table.num_rows, SHARD)]
    costs: dict[str, float] = {}

    def timed(name: str, fn) -> list:
        began = time.perf_counter()
        result = [fn(i, p) for i, p in enumerate(parts)]
        costs[name] = round(time.perf_counter() - began, 4)
        return result

    data = timed("ipc_encode", lambda i, p: ipc_bytes(p))
    timed("sha256", lambda i, p: hashlib.sha256(data[i]).hexdigest())
    timed("crc32", lambda i, p: zlib.crc32(data[i]))
    out.mkdir()
    timed("write", lambda i, p: (out / f"a{i}").write_bytes(data[i]))

    def synced(i: int, p) -> None:
        with open(out / f"b{i}", "wb") as handle:
            handle.write(data[i])
            handle.flush()
            os.fsync(handle.fileno())

    timed("write_fsync", synced)
    began = time.perf_counter()
    fsync_path(out)
    costs["fsync_dir"] = round(time.perf_counter() - began, 4)
    costs["fsync"] = round(costs["write_fsync"] - costs["write"], 4)
    return costs


def allotment_cost(job, tasks: int) -> float:
    """Seconds ``tasks`` un-nested ``enforced`` blocks take: a task run as its own process (one
    mapped Airflow task) enters the allotment itself, whose memory guard lists the process tree
    (psutil); the BatchExecutor (and ``ours``) enters it once for all its tasks."""
    limits = Limits.for_role(job, EXECUTOR_ROLE)
    began = time.perf_counter()
    for i in range(tasks):
        with enforced(limits, f"bench task {i}"):
            pass
    return round(time.perf_counter() - began, 4)


def measure(threads: int) -> dict:
    """All contenders with ``threads`` threads each, in this process."""
    pa.set_cpu_count(threads)
    pa.set_io_thread_count(threads)
    work = Path(tempfile.mkdtemp(prefix="bench-executor-"))
    try:
        data = work / "data"
        rows = make_data(data)
        doc = job_doc(f"file://{data}", hours=1)
        doc["spec"]["dataset"]["streams"][0]["rows_per_shard"] = SHARD
        doc["spec"]["resources"]["roles"][EXECUTOR_ROLE]["cpu"] = threads
        runs: dict[str, list[Clock]] = {k: [] for k in CONTENDERS}
        for run in range(RUNS):
            job = make_job(doc, work / f"job{run}")
            clock, out_rows = ours(job)
            assert out_rows == rows and pa.cpu_count() == threads
            runs["ours"].append(clock)
            runs["floor"].append(floor(data, work / f"floor{run}"))
            for name, fn in (("pandas", with_pandas), ("polars", with_polars)):
                clock, their_rows = fn(job, data, work / f"{name}{run}")
                assert their_rows == rows, name
                runs[name].append(clock)
            clock, their_rows = with_duckdb(job, data, work / f"duckdb{run}", threads)
            assert their_rows == rows
            runs["duckdb"].append(clock)
        table = read_window(JobPaths.for_job(job).window_dir("history", T0))
        best = {k: min(c.wall for c in v) for k, v in runs.items()}
        costs = guarantees(table, work / "guarantees")
        stages = min(runs["ours"], key=lambda c: c.wall).stages
        costs["staging"] = round(stages["stage"] + stages["read"], 4)  # IPC write + crc32 + rename, read back
        costs["task_metrics"] = round(stages["metrics"], 4)  # 16 tasks' scaler snapshots
        costs["task_allotment"] = allotment_cost(job, 16)  # what 16 one-task processes would add
        return {
            "rows": rows, "threads": threads,
            "rate": {k: rows / v for k, v in best.items()}, "wall_s": best,
            "cpu_s": {k: min(c.cpu for c in v) for k, v in runs.items()},
            "stages_s": {k: {s: round(t, 3) for s, t in min(v, key=lambda c: c.wall).stages.items()}
                         for k, v in runs.items()},
            "guarantees_s": costs,
            "clicked_rows": float(pa.compute.sum(table.column("clicked")).as_py()),
        }  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def in_process(threads: int) -> dict:
    env = {**os.environ, "POLARS_MAX_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, __file__, "--threads", str(threads)], env=env, check=True,
                          capture_output=True, text=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--threads":
        print(json.dumps(measure(int(sys.argv[2]))))
        return
    result: dict = {"bench": "executor", "files": FILES * 2, "runs": RUNS}
    for threads in (1, 2):
        got = in_process(threads)
        suffix = "" if threads == 1 else "_2t"
        rate, ours_rate = got["rate"], got["rate"]["ours"]
        result["rows"] = got["rows"]
        for name in CONTENDERS[1:]:
            result[f"ratio_vs_{name}{suffix}"] = round(ours_rate / rate[name], 3)
        result[f"rows_per_s{suffix}"] = {k: round(v) for k, v in rate.items()}
        result[f"wall_s{suffix}"] = {k: round(v, 3) for k, v in got["wall_s"].items()}
        result[f"cpu_s{suffix}"] = {k: round(v, 3) for k, v in got["cpu_s"].items()}
        result[f"stages_s{suffix}"] = got["stages_s"]
        result[f"guarantees_s{suffix}"] = got["guarantees_s"]
        result["clicked_rows"] = got["clicked_rows"]
    result["ratio"] = result["ratio_vs_floor"]
    result["ours_rows_per_s_per_core"] = result["rows_per_s"]["ours"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
