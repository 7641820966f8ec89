"""DTGG vs a naive planner on local disk, HDFS and S3: 2 sources x 42 days x 24 hourly partitions
x 50 files (2,016 partitions, 102,816 files with the success markers).

Naive = per window, per source: check the success marker, list the partition (one thread, no
fusing, no cache). DTGG = the fused planner, once on one thread and once with THREADS listing
threads (``Planner(threads=...)``, ``$PRIMUS_DTGG_THREADS``); every plan is checked identical
to the naive one and to the one-thread one. Storage: local files; a real HDFS (Hadoop's
MiniDFSCluster started with the tests' launcher and jars from $PRIMUS_CACHE, read over WebHDFS,
the files created in one JVM through NameNode RPC); a real SeaweedFS S3 server (the objects
created with ``weed filer.copy``). Each planner first plans one day untimed (the servers' JIT
and caches warm for all alike), then the best of ``repeats`` runs counts. Then, on the first
week of windows, the same through a proxy that adds 10 ms to every request: a model of remote
storage. Also measured: DTGG into the ledger and the cached re-plan a restarted planner does.
Prints one JSON line last.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devstack.proc import port_free
from devstack.tcp_proxy import TcpProxy
from primus_lib.data.dtgg import Planner
from primus_lib.data.dtgg.naive import naive_plan
from primus_lib.spec.loader import job_from_document

DAYS, HOURS, FILES = 42, 24, 50
THREADS = 16  # listing threads of the "with threads" runs
LATENCY_DAYS = 7  # windows measured through the latency proxy
SOURCES = ("impressions", "clicks")
T0 = datetime(2026, 11, 1, tzinfo=UTC)
END = T0 + timedelta(days=DAYS)
LATENCY_MS = 10  # injected per-request latency for the remote-S3 model (real S3 LIST: ~10-50 ms)


def job_for(root_uri: str, home: Path):
    source = {"format": "parquet", "success_marker": "_SUCCESS"}
    doc = {
        "apiVersion": "primus.dev/v1alpha1", "kind": "PrimusJob", "metadata": {"name": "bench-dtgg"},
        "spec": {
            "timer": {"start": "2026-11-01T00:00:00Z", "end": END.strftime("%Y-%m-%dT%H:%M:%SZ"), "window": "1h"},
            "dataset": {"streams": [{"name": "history", "kind": "batch", "sources": [
                {**source, "name": s, "uri": f"{root_uri}/{s}/{{YYYY}}{{MM}}{{DD}}/{{HH}}/"} for s in SOURCES],
                "join": {"keys": ["request_id"]}}]},
            "features": {"label": "clicked", "timestamp": "ts", "sparse": [{"name": "user_id", "buckets": 10}]},
            "model": {"memory_tower": [8], "adapt_tower": [8]},
            "training": {"mode": "offline"},
            "resources": {"roles": {"trainer": {"replicas": 1}}},
            "scaling": {"horizontal": {"enabled": False}},
            "storage": {"root": str(home)},
        },
    }  # fmt: skip
    return job_from_document(doc, env={})


def partitions():
    for d in range(DAYS):
        for h in range(HOURS):
            yield T0 + timedelta(days=d, hours=h)


def layout() -> list[tuple[str, list[str]]]:
    """(partition directory relative to the data root, its file names) of every partition."""
    names = [f"part-{i:05d}.parquet" for i in range(FILES)] + ["_SUCCESS"]
    return [(f"{s}/{when:%Y%m%d}/{when:%H}", names) for when in partitions() for s in SOURCES]


def make_local(root: Path) -> int:
    count = 0
    for directory, names in layout():
        part = root / directory
        part.mkdir(parents=True)
        for name in names:
            (part / name).touch()
        count += len(names)
    return count


def measure(job, threads: int = THREADS, repeats: int = 1, days: int | None = None) -> dict:
    """Best of ``repeats`` for each planner (each run lists and generates everything anew), after
    an untimed warm-up day of each: the first planner must not pay for the server's JIT."""
    end = T0 + timedelta(days=days) if days else None
    warm_end = T0 + timedelta(days=1)
    list(naive_plan(job, "history", end=warm_end))
    list(Planner(job, "history", threads=1, ledger=False).plan(end=warm_end))
    list(Planner(job, "history", threads=threads, ledger=False).plan(end=warm_end))
    naive_s = dtgg_s = dtgg1_s = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()  # as timeit does: a later run must not pay for scanning an earlier run's tasks
        try:
            began = time.perf_counter()
            naive = [p.tasks for p in naive_plan(job, "history", end=end)]
            naive_s = min(naive_s, time.perf_counter() - began)
            one = Planner(job, "history", threads=1, ledger=False)
            began = time.perf_counter()
            single = [p.tasks for p in one.plan(end=end)]
            dtgg1_s = min(dtgg1_s, time.perf_counter() - began)
            planner = Planner(job, "history", threads=threads, ledger=False)
            began = time.perf_counter()
            fused = [p.tasks for p in planner.plan(end=end)]
            dtgg_s = min(dtgg_s, time.perf_counter() - began)
        finally:
            gc.enable()
        assert fused == naive, "DTGG and naive planned different tasks"
        assert single == fused, "the one-thread and the threaded DTGG planned different tasks"
    tasks = sum(len(t) for t in fused)
    return {
        "tasks": tasks, "windows": len(fused), "repeats": repeats, "threads": threads,
        "naive_s": round(naive_s, 3), "naive_tasks_per_s": round(tasks / naive_s),
        "dtgg_s": round(dtgg_s, 3), "dtgg_tasks_per_s": round(tasks / dtgg_s), "dtgg_requests": planner.listings,
        "dtgg_1thread_s": round(dtgg1_s, 3), "dtgg_1thread_tasks_per_s": round(tasks / dtgg1_s),
        "ratio": round(naive_s / dtgg_s, 2), "ratio_1thread": round(naive_s / dtgg1_s, 2),
    }  # fmt: skip


def ledger_figures(job) -> dict:
    planner = Planner(job, "history", threads=4)
    began = time.perf_counter()
    list(planner.plan())
    with_ledger = time.perf_counter() - began
    again = Planner(job, "history", threads=4)
    began = time.perf_counter()
    list(again.plan())
    cached = time.perf_counter() - began
    return {
        "dtgg_into_ledger_s": round(with_ledger, 3),
        "cached_replan_s": round(cached, 3),
        "cached_replan_listings": again.listings,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_weed(root: Path) -> tuple[subprocess.Popen, int, int]:
    (root / "data").mkdir(parents=True)
    (root / "s3.json").write_text(json.dumps({"identities": [{"name": "bench", "credentials": [
        {"accessKey": "bench", "secretKey": "bench-secret"}], "actions": ["Admin", "Read", "Write", "List"]}]}))  # fmt: skip
    port = free_port()
    args = [str(Path(sys.executable).parent / "weed"), "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", f"-s3.port={port}", f"-s3.config={root / 's3.json'}", "-admin.ui=false",
            "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]  # fmt: skip
    for flag in ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "s3.port.grpc",
                 "admin.port", "admin.port.grpc"):  # fmt: skip
        args.append(f"-{flag}={free_port()}")
    filer = free_port()
    while filer + 10000 > 65535 or not port_free(filer + 10000):  # weed filer.copy dials http port + 10000
        filer = free_port()
    args += [f"-filer.port={filer}", f"-filer.port.grpc={filer + 10000}"]
    with open(root / "weed.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
        except urllib.error.HTTPError:
            return proc, port, filer
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):  # the caller never gets proc: leave no weed behind
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(15)
    raise RuntimeError(f"weed did not start (exit {proc.returncode}); see {root / 'weed.log'}")


def make_s3(fs, filer: int, local_root: Path, bucket: str) -> None:
    """Upload the local tree (``local_root``, named ``data``) into the bucket through the filer:
    one Go process, 16 concurrent copies, instead of 100k S3 PUTs from Python."""
    fs.create_dir(bucket)
    weed = str(Path(sys.executable).parent / "weed")
    done = subprocess.run([weed, "filer.copy", "-c", "16", str(local_root), f"http://127.0.0.1:{filer}/buckets/{bucket}/"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"weed filer.copy failed ({done.returncode}): {done.stderr[-500:]}")


BULK_TOUCH = """
import java.io.*; import java.net.URI; import java.util.*; import java.util.concurrent.*;
import org.apache.hadoop.conf.Configuration; import org.apache.hadoop.fs.*;
public class BulkTouch {  // args: NameNode URI, threads; stdin: a directory, then its files, tab-separated
  public static void main(String[] a) throws Exception {
    Configuration conf = new Configuration(false);
    conf.setInt("dfs.replication", 1);
    FileSystem fs = FileSystem.get(new URI(a[0]), conf, "primus");
    ExecutorService pool = Executors.newFixedThreadPool(Integer.parseInt(a[1]));
    List<Future<?>> jobs = new ArrayList<>();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    for (String line; (line = in.readLine()) != null; ) {
      String[] parts = line.split("\t");
      jobs.add(pool.submit(() -> {
        Path dir = new Path(parts[0]); fs.mkdirs(dir);
        for (int i = 1; i < parts.length; i++) fs.create(new Path(dir, parts[i]), true).close();
        return null;
      }));
    }
    for (Future<?> f : jobs) f.get();
    pool.shutdown(); fs.close();
  }
}
"""


# The tests' JVM runs C1 only (a quicker start); a NameNode being measured runs with the full JIT,
# as a production one does.
NAMENODE_JVM_OPTS = ("-Xmx1g", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true")


def start_hdfs(root: Path) -> tuple[subprocess.Popen, dict, str]:
    """The tests' MiniDFSCluster launcher (tests/fixtures/hadoop.py: same jars and flags)."""
    from devstack.proc import start
    from tests.fixtures.hadoop import MAIN_CLASS, jars_dir

    jars = jars_dir()
    if not (jars / ".stamp").exists():
        raise RuntimeError(f"Hadoop jars not in {jars}: run `make infra` (scripts/fetch-hadoop.sh)")
    root.mkdir(parents=True)
    info_file = root / "info.json"
    args = ["java", *NAMENODE_JVM_OPTS, "-cp", f"{jars}/*", MAIN_CLASS, "--dfs", "--base-dir", str(root), "--info-file",
            str(info_file)]  # fmt: skip
    proc = start(args, root / "minicluster.log", info_file.exists, timeout=180)
    return proc, json.loads(info_file.read_text()), f"{jars}/*"


def make_hdfs(root: Path, classpath: str, namenode: str, base: str) -> None:
    """Create every partition's files through NameNode RPC from one JVM (WebHDFS: 2 requests a file)."""
    (root / "BulkTouch.java").write_text(BULK_TOUCH)
    subprocess.run(["javac", "-nowarn", "-cp", classpath, "BulkTouch.java"], cwd=root, check=True, timeout=300)
    lines = "".join("\t".join([f"{base}/{d}", *names]) + "\n" for d, names in layout())
    done = subprocess.run(["java", "-XX:TieredStopAtLevel=1", "-Xmx512m", "-cp", f"{root}:{classpath}", "BulkTouch",
                           namenode, "8"], input=lines, capture_output=True, text=True, cwd=root, timeout=900)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"creating the HDFS layout failed ({done.returncode}): {done.stderr[-800:]}")


def timed(what, *args) -> float:
    began = time.perf_counter()
    what(*args)
    return round(time.perf_counter() - began, 1)


def stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def main() -> None:
    import pyarrow.fs as pafs

    work = Path(tempfile.mkdtemp(prefix="bench-dtgg-"))
    parts = DAYS * HOURS * len(SOURCES)
    result: dict = {"bench": "dtgg", "layout": f"{len(SOURCES)} sources x {DAYS} days x {HOURS} hours x {FILES} files",
                    "partitions": parts, "files": parts * (FILES + 1), "threads": THREADS}  # fmt: skip
    procs: list[subprocess.Popen] = []
    os.environ["HADOOP_USER_NAME"] = "primus"
    try:
        local = work / "local" / "data"
        result["local_setup_s"] = timed(make_local, local)
        job = job_for(f"file://{local}", work / "jobs-local")
        result["local"] = measure(job, repeats=3)
        result["local"].update(ledger_figures(job))
        print(json.dumps({"local": result["local"]}), flush=True)

        hdfs, info, classpath = start_hdfs(work / "hdfs")
        procs.append(hdfs)
        result["hdfs_setup_s"] = timed(make_hdfs, work / "hdfs", classpath, info["namenode_rpc"], "/bench/data")
        webhdfs = urlsplit(info["webhdfs"])
        result["hdfs"] = measure(job_for(f"webhdfs://{webhdfs.netloc}/bench/data", work / "jobs-hdfs"), repeats=2)
        print(json.dumps({"hdfs": result["hdfs"]}), flush=True)

        weed, port, filer = start_weed(work / "weed")
        procs.append(weed)
        for key, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
                           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}.items():  # fmt: skip
            os.environ[key] = value
        fs = pafs.S3FileSystem(access_key="bench", secret_key="bench-secret", endpoint_override=f"127.0.0.1:{port}",
                               scheme="http", region="us-east-1", allow_bucket_creation=True)  # fmt: skip
        result["s3_setup_s"] = timed(make_s3, fs, filer, local, "bench")
        result["s3"] = measure(job_for("s3://bench/data", work / "jobs-s3"), repeats=2)
        print(json.dumps({"s3": result["s3"]}), flush=True)

        hdfs_proxy = TcpProxy(webhdfs.port, delay=LATENCY_MS / 1000)
        uri = f"webhdfs://127.0.0.1:{hdfs_proxy.port}/bench/data"
        result[f"hdfs_latency_{LATENCY_MS}ms"] = measure(job_for(uri, work / "jobs-hdfs-l"), days=LATENCY_DAYS)
        hdfs_proxy.close()
        s3_proxy = TcpProxy(port, delay=LATENCY_MS / 1000)
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{s3_proxy.port}"
        result[f"s3_latency_{LATENCY_MS}ms"] = measure(
            job_for("s3://bench/data", work / "jobs-s3-l"), days=LATENCY_DAYS
        )
        s3_proxy.close()
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)
    for name in ("hdfs", "s3", "local"):
        result[f"ratio_{name}"] = result[name]["ratio"]
        result[f"ratio_{name}_1thread"] = result[name]["ratio_1thread"]
        result[f"{name}_naive_tasks_per_s"] = result[name]["naive_tasks_per_s"]
        result[f"{name}_dtgg_tasks_per_s"] = result[name]["dtgg_tasks_per_s"]
        result[f"{name}_dtgg_1thread_tasks_per_s"] = result[name]["dtgg_1thread_tasks_per_s"]
    for name in ("hdfs", "s3"):
        modelled = result[f"{name}_latency_{LATENCY_MS}ms"]
        result[f"ratio_{name}_latency_{LATENCY_MS}ms"] = modelled["ratio"]
        result[f"ratio_{name}_latency_{LATENCY_MS}ms_1thread"] = modelled["ratio_1thread"]
    result["paper_ratio_fused_scans"] = 23
    print(json.dumps(result))


if __name__ == "__main__":
    main()
