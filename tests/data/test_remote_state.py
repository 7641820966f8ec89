"""Job state on shared storage: committed windows, checkpoints and metric snapshots on a real S3
store (SeaweedFS) and one window on a real HDFS (WebHDFS), committed without rename."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry, Counter

from primus_lib import storage
from primus_lib.data.executor import run_window
from primus_lib.data.shards import MANIFEST, iter_window, read_manifest, read_window, sweep_orphans, write_window
from primus_lib.metrics.reporting import SnapshotWriter, prune_stale
from primus_lib.paths import JobPaths
from primus_lib.spec.errors import SpecError
from primus_lib.spec.loader import job_from_document
from primus_lib.storage import StorageLocation, locate
from primus_lib.train.checkpoint.store import COMMIT, load_latest, save_checkpoint
from tests.data.helpers import T0, write_layout
from tests.fixtures import connections
from tests.fixtures.specs import demo_doc, load

pytestmark = pytest.mark.integration


@pytest.fixture
def bucket(s3_env) -> str:
    name = f"primus-{uuid.uuid4().hex[:8]}"
    s3_env.filesystem().create_dir(name)
    return name


def _table(rows: int = 250) -> pa.Table:
    return pa.table(
        {"id": pa.array(range(rows), pa.int64()), "label": pa.array([i % 2 for i in range(rows)], pa.int8())}
    )


def test_spec_root_on_s3_puts_windows_checkpoints_and_metrics_there(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    doc = demo_doc(f"file://{tmp_path / 'data'}", hours=3, rows_per_shard=100, storage={"root": "s3://state/jobs"})
    paths = JobPaths.for_job(load(doc, env={}))
    assert str(paths.window_dir("history", T0)) == "s3://state/jobs/ctr-demo/windows/history/20261101T000000Z"
    assert str(paths.checkpoints) == "s3://state/jobs/ctr-demo/trainer/checkpoints"
    assert str(paths.metrics_dir) == "s3://state/jobs/ctr-demo/metrics"
    assert paths.root == tmp_path / "home" / "jobs" / "ctr-demo"  # the private working directory
    bad = copy.deepcopy(doc)
    bad["spec"]["storage"] = {"root": "gs://state/jobs"}
    with pytest.raises(SpecError, match="spec.storage.root: expected a local path, file://PATH, s3://BUCKET"):
        job_from_document(bad, env={})


def test_window_committed_to_s3_reads_back_identical_to_a_local_commit(s3_env, bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    write_layout(tmp_path / "data", hours=1, rows=120, files=2)
    doc = demo_doc(f"file://{tmp_path / 'data'}", hours=1, rows_per_shard=100)
    local = run_window(load(doc, storage=tmp_path / "local" / "jobs"), "history", T0).manifest
    doc["spec"]["storage"] = {"root": f"s3://{bucket}/jobs"}
    job = job_from_document(doc, env={})
    result = run_window(job, "history", T0)
    directory = JobPaths.for_job(job).window_dir("history", T0)
    assert isinstance(directory, StorageLocation) and result.queued.path == str(directory)
    assert [s.sha256 for s in result.manifest.shards] == [s.sha256 for s in local.shards]
    assert result.manifest.rows == local.rows == 240
    local_dir = JobPaths.for_job(load(doc, storage=tmp_path / "local" / "jobs")).window_dir("history", T0)
    assert read_window(directory).equals(read_window(local_dir))
    assert read_window(locate(str(directory))).equals(read_window(local_dir))  # by URI, as the queue records it


KILLED_WRITER = """
import os, sys, time
import pyarrow as pa
from primus_lib.data.shards import write_window
from primus_lib.storage import StorageLocation, locate

def stall(self, data):  # the manifest's PUT: announce, then wait for kill -9
    open(sys.argv[2], "w").close()
    time.sleep(600)

StorageLocation.put_atomic = stall
table = pa.table({"id": pa.array(range(250), pa.int64()), "label": pa.array([i % 2 for i in range(250)], pa.int8())})
write_window(locate(sys.argv[1]), table, stream="history", window="w", seed=1, rows_per_shard=100)
"""


def test_writer_killed_between_parts_and_manifest_leaves_nothing_a_reader_accepts(s3_env, bucket, tmp_path):
    uri = f"s3://{bucket}/jobs/j/windows/history/w"
    ready = tmp_path / "parts-written"
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(KILLED_WRITER))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.Popen([sys.executable, str(script), uri, str(ready)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "writer died before its manifest"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    directory = locate(uri)
    orphans = [e.name for e in directory.list()]
    assert len(orphans) == 3 and MANIFEST not in orphans  # all parts, no manifest
    assert read_manifest(directory) is None
    with pytest.raises(FileNotFoundError):
        next(iter_window(directory))
    manifest = write_window(directory, _table(), stream="history", window="w", seed=1, rows_per_shard=100)
    assert read_manifest(directory) == manifest and read_window(directory).equals(_table())
    assert sweep_orphans(directory) == 0  # the dead writer's parts are young: kept for now
    assert sweep_orphans(directory, min_age=0) == 3
    assert sorted(e.name for e in directory.list()) == sorted([MANIFEST, *(s.file for s in manifest.shards)])
    assert read_window(directory).equals(_table())


def test_reader_refuses_a_window_whose_parts_do_not_match(s3_env, bucket):
    directory = locate(f"s3://{bucket}/w")
    manifest = write_window(directory, _table(), stream="history", window="w", seed=1, rows_per_shard=100)
    (directory / manifest.shards[1].file).write_bytes(b"torn")
    with pytest.raises(ValueError, match="missing or has the wrong size"):
        read_manifest(directory)


def test_checkpoint_round_trips_on_s3_and_latest_ignores_a_torn_one(s3_env, bucket):
    directory = locate(f"s3://{bucket}/jobs/j/trainer/checkpoints")
    pending = {"history": _table(7), "stream": None}
    save_checkpoint(directory, 10, {"w": [1.0, 2.0]}, {"mode": "mtrm", "cursor": 3}, pending)
    second = save_checkpoint(directory, 20, {"w": [3.0]}, {"mode": "mtrm", "cursor": 4}, pending)
    ckpt = load_latest(directory)
    assert ckpt is not None and ckpt.step == 20 and str(ckpt.path) == str(second)
    assert ckpt.state == {"w": [3.0]} and ckpt.position["cursor"] == 4
    assert set(ckpt.pending) == {"history"} and ckpt.pending["history"].equals(_table(7))
    torn = directory / "ckpt-0000000030-9999999999999-dead00"  # a writer killed before checkpoint.json
    (torn / "state.pt").write_bytes(b"half")
    (torn / "position.json").write_bytes(b"{}")
    assert load_latest(directory).step == 20
    third = save_checkpoint(directory, 40, {"w": [4.0]}, {"mode": "mtrm"}, {}, keep=2)
    # the oldest commit is pruned (keep=2); the torn one sorts below the newest commit: its writer is gone
    assert [e.name for e in directory.list()] == [second.name, third.name]
    assert (third / COMMIT).exists() and load_latest(directory).step == 40
    assert load_latest(locate(f"s3://{bucket}/nothing-here")) is None


def test_metric_snapshots_land_on_s3(s3_env, bucket):
    registry = CollectorRegistry()
    Counter("primus_rows", "rows", registry=registry).inc(5)
    directory = locate(f"s3://{bucket}/jobs/j/metrics")
    writer = SnapshotWriter(directory, "trainer-0", registry, every=0.0)
    assert writer.maybe_write()
    assert "primus_rows_total 5.0" in (directory / "trainer-0.prom").read_text()
    assert prune_stale(directory, max_age=3600) == 0
    assert prune_stale(directory, max_age=-1) == 1 and not (directory / "trainer-0.prom").exists()


def test_window_and_checkpoint_commit_on_hdfs(hdfs_cluster, monkeypatch, tmp_path):
    connections.webhdfs_user(monkeypatch, tmp_path / "secrets", hdfs_cluster.user)
    base = hdfs_cluster.uri(f"/primus-{uuid.uuid4().hex[:8]}")
    directory = locate(f"{base}/windows/history/w")
    manifest = write_window(directory, _table(), stream="history", window="w", seed=1, rows_per_shard=100)
    assert read_manifest(locate(str(directory))) == manifest and read_window(directory).equals(_table())
    assert write_window(directory, _table(3), stream="history", window="w", seed=1, rows_per_shard=100) == manifest
    checkpoints = locate(f"{base}/trainer/checkpoints")
    save_checkpoint(checkpoints, 5, {"w": 1}, {"mode": "mtrm"}, {"history": _table(4)})
    ckpt = load_latest(checkpoints)
    assert ckpt.step == 5 and ckpt.pending["history"].equals(_table(4))


def test_a_file_replaced_while_it_is_read_on_hdfs_reads_as_one_whole_version(hdfs_cluster, monkeypatch, tmp_path):
    """The executors' registry entries are replaced every heartbeat while trainers read them: a read
    returns one version whole, never a miss (the rename overwrites in one step) nor a torn or failed
    read (the WebHDFS client sizes its reads when it opens the file)."""
    connections.webhdfs_user(monkeypatch, tmp_path / "secrets", hdfs_cluster.user)
    target = locate(hdfs_cluster.uri(f"/primus-{uuid.uuid4().hex[:8]}/executors/realtime/1.json"))
    versions = [b"x" * size for size in (236, 238, 1500)]
    target.put_atomic(versions[0])
    stop, replaced = threading.Event(), []

    def keep_replacing() -> None:
        while not stop.is_set():
            target.put_atomic(versions[len(replaced) % len(versions)])
            replaced.append(1)

    writer = threading.Thread(target=keep_replacing)
    writer.start()
    seen = []
    try:
        deadline = time.monotonic() + 180  # a loaded machine reads slowly; the condition, not a count, ends it
        while len(replaced) < 80 or {len(data) for data in seen} != {len(v) for v in versions}:
            assert time.monotonic() < deadline, f"{len(seen)} reads during {len(replaced)} replacements"
            seen.append(target.read_bytes())
    finally:
        stop.set()
        writer.join(30)
    print(f"\n{len(seen)} reads during {len(replaced)} replacements")
    assert seen and all(data in versions for data in seen), {len(data) for data in seen}
    assert {len(data) for data in seen} == {len(v) for v in versions}  # reads and replacements interleaved
    assert target.read_bytes() == versions[(len(replaced) - 1) % len(versions)]
    assert [entry.name for entry in target.parent.list()] == ["1.json"]  # no temp file left behind


def test_a_beating_executor_never_drops_out_of_the_registry_on_hdfs(hdfs_cluster, monkeypatch, tmp_path):
    """Each heartbeat replaces the entry: a trainer polling meanwhile must always see the executor
    (a missing entry reads as a dead executor)."""
    from primus_lib.resources.discovery import SharedStateDiscovery

    connections.webhdfs_user(monkeypatch, tmp_path / "secrets", hdfs_cluster.user)
    directory = hdfs_cluster.uri(f"/primus-{uuid.uuid4().hex[:8]}/executors/realtime")
    executor = SharedStateDiscovery(directory, heartbeat=0.3, stale=30)
    executor.register(1, "grpc://10.0.0.7:5000", {})
    trainer = SharedStateDiscovery(directory, stale=30)
    try:
        polls = [trainer.locations() for _ in range(120)]
    finally:
        executor.unregister(1)
    assert all(found == {1: "grpc://10.0.0.7:5000"} for found in polls), [p for p in polls if 1 not in p][:3]
    assert trainer.locations() == {}


def test_a_rename_whose_answer_was_lost_is_not_reported_failed_on_hdfs(hdfs_cluster, monkeypatch, tmp_path):
    """The NameNode renamed, then the connection dropped before the answer: the retry finds no temp
    file, and the entry it published must count as published, not as an error."""
    connections.webhdfs_user(monkeypatch, tmp_path / "secrets", hdfs_cluster.user)
    monkeypatch.setattr(storage, "RETRY_SECONDS", 30.0)
    target = locate(hdfs_cluster.uri(f"/primus-{uuid.uuid4().hex[:8]}/checkpoints/LATEST"))
    target.put_atomic(b"step-1")
    client = target.fs.handler.fs
    real_call, lost = client._call, []

    def answer_lost_once(op, *args, **kwargs):
        response = real_call(op, *args, **kwargs)
        if op == "RENAME" and not lost:
            lost.append(kwargs["destination"])
            raise ConnectionError("connection reset by peer (the rename's answer)")
        return response

    monkeypatch.setattr(client, "_call", answer_lost_once)
    target.put_atomic(b"step-2")
    assert lost == [target.path]  # the first answer was lost, the call was asked again
    assert target.read_bytes() == b"step-2"
    assert [entry.name for entry in target.parent.list()] == ["LATEST"]
