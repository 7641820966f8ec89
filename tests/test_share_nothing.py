"""A share-nothing run: every role is its own OS process with its own private working directory.

Per window, the engine calls of the Airflow tasks (DataSource planning, each mapped data task,
the Joiner, the Sink) each run in a fresh ``python -c`` process; two stream executors
(``primus executor``) serve the Kafka topic over Arrow Flight; the trainer is ``primus train``.
Each process gets a fresh directory as cwd, ``PRIMUS_HOME``, ``HOME`` and ``TMPDIR`` and its own
copy of the spec: the only things the roles share are S3 (SeaweedFS: the batch input partitions,
committed windows, checkpoints, metric snapshots), PostgreSQL (the ledger and training queue),
Kafka (the stream) and Flight (executor -> trainer; found through ``$PRIMUS_STREAM_EXECUTORS``).

During the run: kill -9 of a stream executor (restarted on its port), of a batch data task
mid-run (re-run as Airflow's retry would), and of the trainer mid-window (restarted in a NEW
private directory, as a rescheduled pod would be). Then every produced sample (batch + stream,
by sample id) must have been trained exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from primus_lib.data.datagen import generate
from primus_lib.train.runtime.sample_log import read_sample_log
from tests.fixtures._proc import free_port, wait_for_line
from tests.fixtures.specs import ROLES, batch_stream, job_doc, job_yaml, kafka_stream

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
START = datetime(2026, 11, 1, tzinfo=UTC)
HOURS = 4  # windows
ROWS = 200  # impressions per hour
BATCH = 64  # spec.training.batch_size


def spec_text(bucket: str, bootstrap: str, topic: str, database: str) -> str:
    """The tiny job over S3 (its data and its state) and a Kafka topic, its ledger in PostgreSQL."""
    streams = [batch_stream(f"s3://{bucket}/data", lag="1h"), kafka_stream(bootstrap, topic)]
    storage = {"root": f"s3://{bucket}/jobs", "database": database}
    roles = {**ROLES, "stream_executor": {"replicas": 2}}
    doc = job_doc("nothing-shared", hours=HOURS, streams=streams, storage=storage, roles=roles, batch_size=BATCH)
    return job_yaml(doc)


# One Airflow task's engine calls, as the operators in plugins/primus_operators/operators/ make them.
PLAN = """
import json, sys
from primus_lib.data import dtgg
from primus_lib.spec import load_job
from primus_lib.timegrid import parse_utc
job, start = load_job("job.yaml"), parse_utc(sys.argv[1], "window")
ready, missing = dtgg.source_ready(job, "history", sys.argv[2], start)
assert ready, missing
print(json.dumps([t.to_dict() for t in dtgg.plan_source(job, "history", sys.argv[2], start)]))
"""
TASK = """
import json, sys
from primus_lib.data.executor import execute_task
from primus_lib.data.task import DataTask
from primus_lib.spec import load_job
job, task = load_job("job.yaml"), DataTask.from_dict(json.loads(sys.argv[1]))
print("running", flush=True)
print(json.dumps(execute_task(job, task).to_dict()))
"""
JOIN = """
import sys
from primus_lib.data.executor import join_window
from primus_lib.spec import load_job
from primus_lib.timegrid import parse_utc
print(join_window(load_job("job.yaml"), "history", parse_utc(sys.argv[1], "window")).rows)
"""
SINK = """
import sys
from primus_lib.data.executor import sink_window
from primus_lib.spec import load_job
from primus_lib.timegrid import parse_utc
print(sink_window(load_job("job.yaml"), "history", parse_utc(sys.argv[1], "window")))
"""
# The Airflow trainer task's check (operators/trainer.py): are the windows in progress.json?
TRAINED = """
import json, sys
from primus_lib.paths import JobPaths
from primus_lib.progress import consumed_metrics, read_progress
from primus_lib.spec import load_job
keys = [f"history/{w}" for w in sys.argv[1:]]
print(json.dumps(consumed_metrics(read_progress(str(JobPaths.for_job(load_job("job.yaml")).progress)), keys)))
"""


class Roles:
    """Starts role processes, each in a fresh private directory; kills what is left at the end."""

    def __init__(self, spec_text: str, env: dict[str, str], base: Path):
        self.spec_text, self.env, self.base = spec_text, env, base
        self.procs: list[subprocess.Popen] = []

    def private(self, name: str) -> tuple[Path, dict[str, str]]:
        home = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.base))
        (home / "tmp").mkdir()
        (home / "job.yaml").write_text(self.spec_text)  # each role's own copy of the spec
        env = {**self.env, "PRIMUS_HOME": str(home), "HOME": str(home), "TMPDIR": str(home / "tmp")}
        return home, env

    def start(self, name: str, args: list[str], extra: dict[str, str] | None = None) -> subprocess.Popen:
        home, env = self.private(name)
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=home,
            env={**env, **(extra or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def run(self, name: str, script: str, *args: str) -> str:
        proc = self.start(name, ["-c", textwrap.dedent(script), *args])
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name} failed:\n{out.decode()[-3000:]}"
        return out.decode().strip().splitlines()[-1]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _steps(log: Path) -> int:
    return log.read_text().count("\nstep ") if log.exists() else 0


def _wait(predicate, what: str, timeout: float = 180.0, procs: tuple[subprocess.Popen, ...] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for proc in procs:
            assert proc.poll() is None, f"{what}: a process died:\n{proc.stdout.read().decode()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_every_role_in_its_own_process_and_directory_trains_every_sample_once(
    s3_server, postgres_server, kafka_broker, tmp_path
):
    began = time.monotonic()
    bucket = f"share-nothing-{uuid.uuid4().hex[:8]}"
    s3 = s3_server.filesystem()
    s3.create_dir(bucket)
    topic = kafka_broker.new_topic(partitions=4, prefix="events")
    database = postgres_server.create_database("share_nothing")
    text = spec_text(bucket, kafka_broker.bootstrap, topic, database)

    # The test itself is the outside world: it writes the batch partitions to S3 and produces
    # the stream to Kafka (window by window, below).
    data = tmp_path / "generated"
    generate(data, START, START + timedelta(hours=HOURS), rows_per_hour=ROWS, seed=5)
    pafs.copy_files(str(data / "impressions"), f"{bucket}/data/impressions", destination_filesystem=s3)
    pafs.copy_files(str(data / "clicks"), f"{bucket}/data/clicks", destination_filesystem=s3)
    batch_ids = [
        i for f in sorted((data / "impressions").rglob("*.parquet")) for i in pq.read_table(f)["request_id"].to_pylist()
    ]
    events = [json.loads(line) for line in (data / "stream" / "events.jsonl").read_text().splitlines()]
    # The trainer trains stream rows in full minibatches only: a partial one waits for more events
    # (it is not checkpointed, so a successor is served it again). A whole number of minibatches
    # lets the run end with every stream row trained.
    events = events[: len(events) // BATCH * BATCH]
    by_hour: dict[int, list[dict]] = {h: [] for h in range(HOURS)}
    for event in events:
        hour = min(HOURS - 1, max(0, (int(event["ts"]) - int(START.timestamp() * 1000)) // 3_600_000))
        by_hour[hour].append(event)

    ports = [free_port(), free_port()]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIMUS_", "AWS_"))}
    # the store and the broker's login as the roles' mounted secret files (one directory, as a pod mounts one)
    env.update(s3_server.env(tmp_path / "secrets"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env["PRIMUS_STREAM_EXECUTORS"] = ",".join(f"grpc://127.0.0.1:{p}" for p in ports)
    # The trainer's sample log is the test's own observation channel (not state the roles
    # share): both trainer incarnations append to it, so it lives outside their private dirs.
    log = tmp_path / "trained-ids.log"
    roles = Roles(text, env, tmp_path)

    def executor(index: int) -> subprocess.Popen:
        args = ["-m", "primus_lib.cli.main", "executor", "job.yaml", "--index", str(index), "--replicas", "2"]
        proc = roles.start(
            f"executor{index}", [*args, "--port", str(ports[index]), "--buffer-rows", "300", "--poll-rows", "100"]
        )
        wait_for_line(proc, "serving", timeout=120.0)
        return proc

    def trainer(name: str, idle_exit: int, step_delay: float) -> subprocess.Popen:
        args = [
            "-m",
            "primus_lib.cli.main",
            "train",
            "job.yaml",
            "--checkpoint-steps",
            "3",
            "--poll-interval",
            "0.1",
            "--idle-exit",
            str(idle_exit),
            "--sample-log",
            str(log),
            "--step-delay",
            str(step_delay),
        ]
        return roles.start(name, args)

    def window(hour: int, kill_a_task: bool = False) -> None:
        start = (START + timedelta(hours=hour)).strftime("%Y-%m-%dT%H:%M:%SZ")
        tasks = []
        for source in ("impressions", "clicks"):
            tasks += json.loads(roles.run(f"w{hour}-source-{source}", PLAN, start, source))
        for i, task in enumerate(tasks):
            if kill_a_task and i == 0:  # kill -9 mid-run, then Airflow's retry: a new process, a new dir
                proc = roles.start(f"w{hour}-task{i}-try1", ["-c", textwrap.dedent(TASK), json.dumps(task)])
                wait_for_line(proc, "running", timeout=120.0)
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                assert proc.returncode == -signal.SIGKILL
            roles.run(f"w{hour}-task{i}", TASK, json.dumps(task))
        roles.run(f"w{hour}-join", JOIN, start)
        roles.run(f"w{hour}-sink", SINK, start)

    def produce(hour: int) -> None:
        values = [json.dumps(e).encode() for e in by_hour[hour]]
        for p in range(4):
            kafka_broker.produce(topic, values[p::4], partition=p)

    try:
        executors = [executor(0), executor(1)]
        train = trainer("trainer-a", 600, 0.5)  # slow: still training window 2 when killed
        produce(0)
        window(0)
        _wait(lambda: _steps(log) >= 5, "the trainer's first steps", procs=(train, *executors))
        # kill -9 of a stream executor while the trainer pulls from it; restarted on its port
        executors[1].send_signal(signal.SIGKILL)
        executors[1].wait(30)
        executors[1] = executor(1)
        produce(1)
        window(1, kill_a_task=True)
        # counted before hour 2 is released: its stream rows and batch window 2 are four steps or more
        # ahead (counted after window 2's sink, a busy host let the trainer take them all first)
        seen = _steps(log)
        produce(2)
        window(2)
        # kill -9 of the trainer in window 2; its successor starts in a new private directory
        _wait(lambda: _steps(log) >= seen + 2, "the trainer in window 2", procs=(train,))
        train.send_signal(signal.SIGKILL)
        train.wait(30)
        assert train.returncode == -signal.SIGKILL
        train = trainer("trainer-b", 45, 0.05)  # > the time to build a window: exits once all is trained
        produce(3)
        window(3)
        out, _ = train.communicate(timeout=300)
        assert train.returncode == 0, out.decode()[-3000:]
        wids = [(START + timedelta(hours=h)).strftime("%Y%m%dT%H%M%SZ") for h in range(HOURS)]
        consumed = json.loads(roles.run("airflow-trainer-task", TRAINED, *wids))  # on shared storage
    finally:
        roles.close()
        print(f"share-nothing run took {time.monotonic() - began:.0f}s")

    trained = read_sample_log(log.read_text())
    resumed_at = trained.resumed_at
    assert len(resumed_at) == 2 and resumed_at[0] == 0 and resumed_at[1] > 0, resumed_at
    expected = Counter([("history", i) for i in batch_ids] + [("realtime", e["request_id"]) for e in events])
    counts = trained.count(expected)
    print(f"share-nothing: trainer resumed from step {resumed_at[1]}: {counts}")
    assert counts.exactly_once, counts  # exactly once in the checkpointed model state
    assert set(trained.raw) == set(expected)  # the raw step log: at least once
    assert consumed is not None and sum(w["samples"] for w in consumed.values()) == len(batch_ids), consumed
