"""A node lost under the trainer on YARN, counted end to end: the trainer role is a real ``primus
train`` in a YARN container (our AM runs it; tests/fixtures/hadoop.py: a MiniYARNCluster with two
NodeManagers and its HDFS), its checkpoints and progress on HDFS (``storage.root: webhdfs://``),
the training queue on PostgreSQL. The test is the data plane's Sink: it commits four batch windows
(shards on HDFS, queue rows in PostgreSQL). Mid-training the trainer's process gets SIGKILL (what
a lost node does to it); the AM fails the attempt, the ResourceManager starts attempt 2 in a new
container with its own working directory (``PRIMUS_HOME`` inside it: nothing local carries over),
which resumes from the checkpoint on HDFS. Every committed sample must be trained exactly once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from primus_lib.data.datagen import generate
from primus_lib.evaluation.replay import batch_window
from primus_lib.paths import JobPaths
from primus_lib.progress import read_progress
from primus_lib.resources.yarn import YarnBackend
from primus_lib.spec import load_job
from primus_lib.train.runtime.sample_log import read_sample_log
from tests.fixtures.specs import batch_stream, job_doc, write_spec
from tests.resources.test_yarn import wait_for
from tests.train.conftest import START, commit_windows

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.slow]

HOURS, ROWS = 4, 200


def yarn_doc(name: str, data: Path, rm: str, root: str, database: str, train: str) -> dict:
    """The tiny job, offline, on the test YARN cluster: its state on HDFS, its ledger in PostgreSQL,
    its trainer the shell command ``train`` (one restart allowed)."""
    image = "primus-trainer:latest"
    roles = {
        "data_executor": {"replicas": 1, "image": image},
        "trainer": {"replicas": 1, "memory": "1Gi", "max_restarts": 1, "image": image, "command": ["sh", "-c", train]},
    }
    return job_doc(
        name,
        hours=HOURS,
        streams=[batch_stream(f"file://{data}")],
        training={"mode": "offline", "batch_size": 64, "learning_rate": 0.01, "sparse_learning_rate": 0.1},
        storage={"root": root, "database": database},
        backend="yarn",
        resources={"clusters": [{"name": "mini", "backend": "yarn", "resource_manager": rm}]},
        roles=roles,
    )


# the container's own directory as PRIMUS_HOME and TMPDIR: a new attempt starts with nothing local
TRAIN = (
    'export PRIMUS_HOME="$PWD/home" TMPDIR="$PWD" OMP_NUM_THREADS=1; exec {python} -m primus_lib.cli.main '
    "train {{SPEC}} --checkpoint-steps 3 --poll-interval 0.2 --until-window 20261101T{last:02d}0000Z --sample-log {log} "
    "--step-delay 0.4"  # the kill lands mid-training
)


def test_a_killed_trainer_container_resumes_on_yarn_from_its_checkpoint_on_hdfs(
    yarn_cluster, postgres_server, tmp_path, monkeypatch
):
    data, log = tmp_path / "data", tmp_path / "trained-ids.log"  # the log: the test's observation channel
    generate(data, START, START + timedelta(hours=HOURS), rows_per_hour=ROWS, seed=9)
    spec = tmp_path / "job.yaml"
    name, root = f"yarn-loss-{uuid.uuid4().hex[:6]}", yarn_cluster.hdfs.uri(f"/primus-{uuid.uuid4().hex[:8]}")
    train = TRAIN.format(python=sys.executable, last=HOURS - 1, log=log)
    database = postgres_server.create_database("yarn_loss")
    write_spec(spec, yarn_doc(name, data, yarn_cluster.rm_url, root, database, train))
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    job = load_job(spec)
    paths = JobPaths.for_job(job)
    assert paths.shared is not None and str(paths.checkpoints).startswith("webhdfs://")
    sizes = commit_windows(job, range(HOURS))  # the Sink's work: shards on HDFS, queue rows in PostgreSQL
    backend = YarnBackend(job, str(spec), roles=["trainer"])
    try:
        backend.submit()
        runs = lambda: [line.split() for line in log.read_text().splitlines() if line.startswith("run ")]  # noqa: E731
        steps = lambda: log.read_text().count("\nstep ") if log.exists() else 0  # noqa: E731
        wait_for(lambda: log.exists() and steps() >= 7, 240, "the trainer's first steps on YARN", every=0.1)
        first = runs()[0]
        pid, container = int(first[1]), backend.workers("trainer")["trainer"][0]["container"]
        assert psutil.Process(pid).environ()["PRIMUS_HOME"] != os.environ["PRIMUS_HOME"]  # its own directory
        os.kill(pid, signal.SIGKILL)  # the node is gone from under the trainer
        killed_at = steps()
        killed = time.monotonic()
        wait_for(lambda: len(runs()) == 2, 180, "attempt 2 of the trainer")
        restarted = time.monotonic() - killed
        status = wait_for(lambda: (s := backend.status()).phase == "Succeeded" and s, 300, "the trainer to finish")
        second = backend.workers("trainer")["trainer"][0]
    finally:
        backend.stop()

    trained = read_sample_log(log.read_text())
    resumed_at = trained.resumed_at
    expected = Counter(
        ("history", i)
        for hour in range(HOURS)
        for i in batch_window(job, job.stream("history"), START + timedelta(hours=hour))
        .column("request_id")
        .to_pylist()
    )
    counts = trained.count(expected)
    progress = read_progress(paths.progress)  # on HDFS, as the Airflow trainer task reads it
    windows = {k: v["samples"] for k, v in progress["consumed"].items() if k.startswith("history/")}
    print(
        f"\nyarn node loss: {counts}; killed at step {killed_at}, resumed from step "
        f"{resumed_at[-1]}, attempt 2 training {restarted:.1f}s after the kill; restarts "
        f"{status.roles['trainer'].restarts}"
    )
    assert resumed_at[0] == 0 and 0 < resumed_at[1] <= killed_at, resumed_at  # from a checkpoint, not from scratch
    assert counts.exactly_once, counts  # exactly once in the checkpointed model state
    assert set(trained.raw) == set(expected)  # the raw step log: at least once
    assert sum(expected.values()) == sum(sizes)
    assert [windows[k] for k in sorted(windows)] == sizes  # per-window stats survived the kill exactly once
    assert status.roles["trainer"].restarts == 1 and status.roles["trainer"].succeeded == 1
    assert second["container"] != container and second["attempt"].endswith("_000002")  # the RM's new attempt
