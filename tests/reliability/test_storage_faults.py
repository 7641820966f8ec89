"""Storage trouble: the job's disk fills up, the object store goes away.

Local: the job's staging, windows and trainer directories live on a 4 MiB tmpfs of the test's own
(``mount -t tmpfs``: the container runs as root), filled to the last page, so writes fail with a
real ENOSPC. A data task, the Joiner's commit and a trainer checkpoint must fail naming the path
and "No space left on device", leave nothing a reader accepts, and commit exactly once after the
space is freed. S3: our own SeaweedFS, stopped (SIGKILL) in the middle of a window commit: the
commit retries (``primus_lib.storage.RETRY_SECONDS``) and completes once the store is back, or past the bound
fails with one clear line, leaving no manifest. Counted by sample id (request_id).
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch

from devstack import seaweedfs
from primus_lib import storage
from primus_lib.data.dtgg.planner import Planner
from primus_lib.data.executor import TaskFailed, execute_task, join_window, run_window, sink_window, staging_path
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.shards import read_manifest, read_window
from primus_lib.data.training_queue import TrainingQueue
from primus_lib.paths import JobPaths, window_id
from primus_lib.storage import StorageUnavailable
from primus_lib.train.checkpoint.store import load_latest, save_checkpoint
from tests.data.helpers import T0, write_layout
from tests.fixtures._proc import start, stop
from tests.fixtures.s3 import ACCESS_KEY, SECRET_KEY, S3Server, weed_binary
from tests.fixtures.specs import demo_doc, load

NO_SPACE = "No space left on device"
T1 = T0 + timedelta(hours=1)


# -- a small filesystem of our own ---------------------------------------------------------------
@pytest.fixture
def disk(tmp_path):
    """A 4 MiB tmpfs mounted for this test (unmounted after it)."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True, text=True
    )
    assert done.returncode == 0, f"mount -t tmpfs refused (the test needs root): {done.stderr.strip()}"
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def _fill(disk: Path) -> Path:
    """Write a filler file until the filesystem has no page left; returns it (delete it to free)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)
    return filler


def _local_job(tmp_path: Path, disk: Path, data: Path):
    """A job whose ledger is on the ordinary disk and whose data directories are on ``disk``."""
    job = load(demo_doc(f"file://{data}", hours=2, rows_per_shard=100), storage=tmp_path / "jobs")
    root = JobPaths.for_job(job).root
    root.mkdir(parents=True)
    for name in ("staging", "windows", "trainer"):
        (disk / name).mkdir()
        (root / name).symlink_to(disk / name)
    return job


def _source_ids(data: Path, hour) -> list[str]:
    files = sorted((data / "impressions" / f"{hour:%Y%m%d}" / f"{hour:%H}").glob("*.parquet"))
    return [i for f in files for i in pq.read_table(f, columns=["request_id"]).column(0).to_pylist()]


def _check_once(window: pa.Table, produced: list[str]) -> dict[str, int]:
    """The committed window against the source: every sample once (counts by request_id)."""
    seen = collections.Counter(window.column("request_id").to_pylist())
    counts = {
        "produced": len(produced),
        "committed": sum(seen.values()),
        "lost": len(set(produced) - set(seen)),
        "duplicated": sum(n - 1 for n in seen.values() if n > 1),
    }
    assert counts["lost"] == counts["duplicated"] == 0 and set(seen) == set(produced), counts
    return counts


def _no_leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.rglob("*") if ".tmp" in p.name or p.name.startswith(".ckpt-")]


@pytest.mark.slow
def test_full_staging_disk_fails_the_data_task_and_the_retry_commits_once(tmp_path, disk):
    data = tmp_path / "data"
    write_layout(data, hours=2, rows=150, files=2)
    job = _local_job(tmp_path, disk, data)
    plan = Planner(job, "history", threads=1).plan_window(T0)
    filler = _fill(disk)
    task = plan.tasks[0]
    with pytest.raises(OSError) as caught:  # the Airflow data task's call
        execute_task(job, task)
    message = str(caught.value)
    assert NO_SPACE in message and str(staging_path(job, task).parent) in message, message
    assert not staging_path(job, task).exists() and _no_leftovers(disk / "staging") == []
    with pytest.raises(TaskFailed) as failed:  # a whole window: its tasks fail after their attempts
        run_window(job, "history", T0, workers=1)
    assert NO_SPACE in str(failed.value) and "window 20261101T000000Z" in str(failed.value)
    paths = JobPaths.for_job(job)
    assert read_manifest(paths.window_dir("history", T0)) is None
    assert TrainingQueue(paths.ledger).windows("history") == []
    filler.unlink()  # the operator frees space and retries the window's failed tasks
    assert TaskLedger(paths.ledger).retry_failed("history", window_id(T0)) == len(plan.tasks)
    first = run_window(job, "history", T0, workers=1)
    again = run_window(job, "history", T0, workers=1)  # a retried Airflow run: nothing new
    assert again.queued.seq == first.queued.seq
    assert [w.window for w in TrainingQueue(paths.ledger).windows("history")] == [window_id(T0)]
    counts = _check_once(read_window(paths.window_dir("history", T0)), _source_ids(data, T0))
    print(f"\nfull staging disk: {counts}")


@pytest.mark.slow
def test_full_disk_at_the_joiner_commit_leaves_no_window_and_the_retry_commits_once(tmp_path, disk):
    data = tmp_path / "data"
    write_layout(data, hours=2, rows=150, files=2)
    job = _local_job(tmp_path, disk, data)
    for task in Planner(job, "history", threads=1).plan_window(T1).tasks:
        execute_task(job, task)  # staged while there was space
    filler = _fill(disk)
    paths = JobPaths.for_job(job)
    directory = paths.window_dir("history", T1)
    with pytest.raises(OSError) as caught:
        join_window(job, "history", T1)
    assert NO_SPACE in str(caught.value) and str(directory.parent) in str(caught.value), str(caught.value)
    assert read_manifest(directory) is None and not directory.exists()
    assert _no_leftovers(disk / "windows") == []
    assert TrainingQueue(paths.ledger).windows("history") == []
    filler.unlink()
    manifest = join_window(job, "history", T1)  # the staged outputs survived the failed commit
    queued = sink_window(job, "history", T1)
    assert join_window(job, "history", T1) == manifest and sink_window(job, "history", T1) == queued
    assert [w.window for w in TrainingQueue(paths.ledger).windows("history")] == [window_id(T1)]
    counts = _check_once(read_window(directory), _source_ids(data, T1))
    print(f"\nfull disk at the join: {counts}")


def test_full_disk_fails_a_checkpoint_and_the_previous_one_stays_latest(tmp_path, disk):
    directory = disk / "trainer" / "checkpoints"
    pending = pa.table({"request_id": [f"r{i}" for i in range(50)], "label": [i % 2 for i in range(50)]})
    save_checkpoint(directory, 10, {"w": torch.zeros(1000)}, {"cursor": 3}, {"history": pending})
    filler = _fill(disk)
    with pytest.raises(OSError) as caught:
        save_checkpoint(directory, 20, {"w": torch.ones(100_000)}, {"cursor": 5}, {"history": pending.slice(10)})
    message = str(caught.value)
    assert NO_SPACE in message and str(directory) in message and "state.pt" in message, message
    latest = load_latest(directory)
    assert latest.step == 10 and latest.position["cursor"] == 3 and latest.pending["history"].equals(pending)
    assert _no_leftovers(directory) == []
    filler.unlink()
    save_checkpoint(directory, 20, {"w": torch.ones(100_000)}, {"cursor": 5}, {"history": pending.slice(10)})
    latest = load_latest(directory)
    assert (
        latest.step == 20
        and latest.pending["history"].num_rows == 40
        and torch.equal(latest.state["w"], torch.ones(100_000))
    )


# -- an object store that goes away ---------------------------------------------------------------
class Weed:
    """Our own SeaweedFS S3 gateway (as tests/fixtures/s3.py starts it), on fixed ports so it can
    be killed and started again over the same data."""

    def __init__(self, root: Path):
        self.mini = seaweedfs.weed_mini(root, ACCESS_KEY, SECRET_KEY, weed_binary())
        self.server = S3Server(self.mini.endpoint)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = start(self.mini.args, self.mini.log, self._ready, timeout=90)

    def _ready(self) -> bool:
        import pyarrow.fs as pafs

        # ListBuckets: a real request (get_file_info("/") answers without asking the gateway)
        self.server.filesystem().get_file_info(pafs.FileSelector("/", recursive=False))
        return True

    def kill(self) -> None:
        if self.proc is not None:
            stop(self.proc, signal.SIGKILL)


@pytest.fixture
def weed(tmp_path, monkeypatch):
    server = Weed(tmp_path / "weed")
    server.start()
    try:  # stopped whatever fails after it started
        for key, value in server.server.env(tmp_path / "secrets").items():
            monkeypatch.setenv(key, value)
        server.server.filesystem().create_dir("state")
        yield server
    finally:
        server.kill()


def _s3_job(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))  # the ledger: SQLite on the local disk
    data = tmp_path / "data"
    write_layout(data, hours=2, rows=200, files=2)
    # 2 rows a shard: 200 PUTs, the store dies mid-commit
    job = load(demo_doc(f"file://{data}", hours=2, rows_per_shard=2, storage={"root": "s3://state/jobs"}), env={})
    return job, data


def _stage_and_commit_in_background(job, hour) -> tuple[threading.Thread, dict]:
    for task in Planner(job, "history", threads=1).plan_window(hour).tasks:
        execute_task(job, task)
    outcome: dict = {}

    def commit() -> None:
        try:
            outcome["manifest"] = join_window(job, "history", hour)
            outcome["queued"] = sink_window(job, "history", hour)
        except Exception as exc:  # reported to the test thread
            outcome["error"] = exc

    return threading.Thread(target=commit, daemon=True), outcome


def _kill_mid_commit(weed: Weed, directory, thread: threading.Thread) -> None:
    """Kill the store once the commit has written some of its parts."""
    thread.start()
    deadline = time.monotonic() + 120
    listing = pafs.FileSelector(directory.path, allow_not_found=True)
    while not [e for e in weed.server.filesystem().get_file_info(listing) if e.base_name.startswith("part-")]:
        assert thread.is_alive() and time.monotonic() < deadline, "the commit ended before any part was written"
        time.sleep(0.01)
    weed.kill()


@pytest.mark.slow
def test_object_store_down_mid_commit_retries_and_commits_once_it_is_back(tmp_path, weed, monkeypatch):
    monkeypatch.setattr(storage, "RETRY_SECONDS", 180.0)
    job, data = _s3_job(tmp_path, monkeypatch)
    directory = JobPaths.for_job(job).window_dir("history", T0)
    thread, outcome = _stage_and_commit_in_background(job, T0)
    _kill_mid_commit(weed, directory, thread)
    time.sleep(3)
    assert thread.is_alive() and not outcome  # retrying, not failed, nothing committed
    weed.start()
    thread.join(timeout=240)
    assert not thread.is_alive() and "error" not in outcome, outcome
    assert read_manifest(directory) == outcome["manifest"]
    assert [w.window for w in TrainingQueue(JobPaths.for_job(job).ledger).windows("history")] == [window_id(T0)]
    counts = _check_once(read_window(directory), _source_ids(data, T0))
    print(f"\nS3 down mid-commit, back after ~3s: {counts}")


@pytest.mark.slow
def test_object_store_down_past_the_bound_fails_clearly_and_commits_nothing(tmp_path, weed, monkeypatch):
    monkeypatch.setattr(storage, "RETRY_SECONDS", 4.0)
    job, data = _s3_job(tmp_path, monkeypatch)
    directory = JobPaths.for_job(job).window_dir("history", T0)
    thread, outcome = _stage_and_commit_in_background(job, T0)
    _kill_mid_commit(weed, directory, thread)
    thread.join(timeout=120)
    error = outcome.get("error")
    assert isinstance(error, StorageUnavailable), outcome
    message = str(error)
    assert "\n" not in message and "(the retry bound)" in message and str(directory) in message, message
    weed.start()
    # the retry below runs under the deployment's bound: a restarted SeaweedFS lists buckets before
    # its volume server is back (GetObject answers 500 meanwhile), which took over 4 s on a busy host
    monkeypatch.setattr(storage, "RETRY_SECONDS", 120.0)
    assert read_manifest(directory) is None  # the parts written before the outage are not a window
    ledger = JobPaths.for_job(job).ledger
    assert TrainingQueue(ledger).windows("history") == []
    join_window(job, "history", T0)  # the Airflow retry of the join task
    sink_window(job, "history", T0)
    assert [w.window for w in TrainingQueue(ledger).windows("history")] == [window_id(T0)]
    counts = _check_once(read_window(directory), _source_ids(data, T0))
    print(f"\nS3 down past the bound: {message}\nthen retried: {counts}")
