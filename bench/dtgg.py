"""DTGG vs a naive planner: plan 2 sources x 14 days x 24 hourly partitions x N files.

Naive = per window, per source: check the success marker, list the partition (one thread, no
fusing, no cache). DTGG = fused scans over the shared prefix, parallel listing and generation
(4 threads), ordered output. Both produce the same tasks (checked). Runs on local files (50
files per partition) and on a real SeaweedFS S3 server started here (10 files per partition:
creating 33,600 objects one PUT at a time takes minutes), then once more through a proxy
that adds 10 ms to every request, a model of a remote S3 endpoint. Local: best of 5 runs,
loopback S3: best of 3, the latency model: one run (the naive planner takes ~17 s there).
Also measured: DTGG into the ledger and the cached re-plan a restarted planner does. Prints
one JSON line last.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_lib.data.dtgg import Planner
from primus_lib.data.dtgg.naive import naive_plan
from primus_lib.spec.loader import job_from_document

DAYS, HOURS = 14, 24
SOURCES = ("impressions", "clicks")
T0 = datetime(2026, 11, 1, tzinfo=UTC)
LATENCY_MS = 10  # injected per-request latency for the remote-S3 model (real S3 LIST: ~10-50 ms)


def job_for(root_uri: str, home: Path):
    source = {"format": "parquet", "success_marker": "_SUCCESS"}
    doc = {
        "apiVersion": "primus.dev/v1alpha1", "kind": "PrimusJob", "metadata": {"name": "bench-dtgg"},
        "spec": {
            "timer": {"start": "2026-11-01T00:00:00Z", "end": "2026-11-15T00:00:00Z", "window": "1h"},
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


def make_local(root: Path, files: int) -> int:
    count = 0
    for when in partitions():
        for s in SOURCES:
            part = root / s / f"{when:%Y%m%d}" / f"{when:%H}"
            part.mkdir(parents=True)
            for i in range(files):
                (part / f"part-{i:05d}.parquet").touch()
            (part / "_SUCCESS").touch()
            count += files
    return count


def measure(job, threads: int = 4, repeats: int = 1) -> dict:
    """Best of ``repeats`` for each planner (each run lists and generates everything anew)."""
    naive_s = dtgg_s = dtgg1_s = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        naive = list(naive_plan(job, "history"))
        naive_s = min(naive_s, time.perf_counter() - began)
        planner = Planner(job, "history", threads=threads, ledger=False)
        began = time.perf_counter()
        fused = list(planner.plan())
        dtgg_s = min(dtgg_s, time.perf_counter() - began)
        assert [p.tasks for p in fused] == [p.tasks for p in naive], "DTGG and naive planned different tasks"
        one = Planner(job, "history", threads=1, ledger=False)
        began = time.perf_counter()
        list(one.plan())
        dtgg1_s = min(dtgg1_s, time.perf_counter() - began)
    tasks = sum(len(p.tasks) for p in fused)
    return {
        "tasks": tasks, "windows": len(fused), "repeats": repeats,
        "naive_s": round(naive_s, 3), "naive_tasks_per_s": round(tasks / naive_s),
        "naive_requests": len(fused) * len(SOURCES) * 2,
        "dtgg_s": round(dtgg_s, 3), "dtgg_tasks_per_s": round(tasks / dtgg_s), "dtgg_requests": planner.listings,
        "dtgg_1thread_s": round(dtgg1_s, 3),
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


def start_weed(root: Path) -> tuple[subprocess.Popen, int]:
    (root / "data").mkdir(parents=True)
    (root / "s3.json").write_text(json.dumps({"identities": [{"name": "bench", "credentials": [
        {"accessKey": "bench", "secretKey": "bench-secret"}], "actions": ["Admin", "Read", "Write", "List"]}]}))  # fmt: skip
    port = free_port()
    args = [str(Path(sys.executable).parent / "weed"), "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", f"-s3.port={port}", f"-s3.config={root / 's3.json'}", "-admin.ui=false",
            "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]  # fmt: skip
    for flag in ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
                 "filer.port.grpc", "s3.port.grpc", "admin.port", "admin.port.grpc"):  # fmt: skip
        args.append(f"-{flag}={free_port()}")
    with open(root / "weed.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
        except urllib.error.HTTPError:
            return proc, port
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):  # the caller never gets proc: leave no weed behind
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(15)
    raise RuntimeError(f"weed did not start (exit {proc.returncode}); see {root / 'weed.log'}")


class LatencyProxy:
    """A TCP proxy that holds every client->server chunk for ``delay`` seconds: it models the
    per-request latency of a remote S3 endpoint (tens of ms) in front of the loopback server."""

    def __init__(self, upstream: int, delay: float):
        self.upstream, self.delay = upstream, delay
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, upstream, self.delay), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, 0.0), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while data := src.recv(65536):
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()


def make_s3(fs, bucket: str, files: int) -> int:
    fs.create_dir(bucket)
    keys = []
    for when in partitions():
        for s in SOURCES:
            base = f"{bucket}/data/{s}/{when:%Y%m%d}/{when:%H}/"
            keys += [base + f"part-{i:05d}.parquet" for i in range(files)] + [base + "_SUCCESS"]

    def put(key: str) -> None:
        with fs.open_output_stream(key) as out:
            out.write(b"")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, keys))
    return len(keys)


def main() -> None:
    import pyarrow.fs as pafs

    work = Path(tempfile.mkdtemp(prefix="bench-dtgg-"))
    result: dict = {"bench": "dtgg", "layout": f"{len(SOURCES)} sources x {DAYS} days x {HOURS} hours"}
    proc = None
    try:
        began = time.perf_counter()
        files = make_local(work / "local", 50)
        result["local_files"] = files
        result["local_setup_s"] = round(time.perf_counter() - began, 1)
        job = job_for(f"file://{work / 'local'}", work / "jobs-local")
        result["local"] = measure(job, repeats=5)
        result["local"].update(ledger_figures(job))
        print(json.dumps(result["local"]), flush=True)

        proc, port = start_weed(work / "weed")
        for key, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
                           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}.items():  # fmt: skip
            os.environ[key] = value
        fs = pafs.S3FileSystem(access_key="bench", secret_key="bench-secret", endpoint_override=f"127.0.0.1:{port}",
                               scheme="http", region="us-east-1", allow_bucket_creation=True)  # fmt: skip
        began = time.perf_counter()
        objects = make_s3(fs, "bench", 10)
        result["s3_objects"] = objects
        result["s3_files_per_partition"] = 10
        result["s3_setup_s"] = round(time.perf_counter() - began, 1)
        result["s3"] = measure(job_for("s3://bench/data", work / "jobs-s3"), repeats=3)
        print(json.dumps(result["s3"]), flush=True)
        proxy = LatencyProxy(port, LATENCY_MS / 1000)
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
        result[f"s3_latency_{LATENCY_MS}ms"] = measure(job_for("s3://bench/data", work / "jobs-s3-latency"))
        proxy.close()
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    result["ratio"] = result["s3"]["ratio"]
    result["ratio_local"] = result["local"]["ratio"]
    result[f"ratio_s3_latency_{LATENCY_MS}ms"] = result[f"s3_latency_{LATENCY_MS}ms"]["ratio"]
    result["paper_ratio_fused_scans"] = 23
    print(json.dumps(result))


if __name__ == "__main__":
    main()
