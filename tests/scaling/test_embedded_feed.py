"""The embedded default end to end: real batch data tasks and a real trainer write the metric
snapshots, and the scaler (no Prometheus) decides from them instead of holding for lack of metrics."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

import pytest

from primus_lib.data.executor import run_window
from primus_lib.data.executor.metrics import TaskMetrics
from primus_lib.metrics.readers import TextfileReader
from primus_lib.paths import JobPaths
from primus_lib.scaling.horizontal import STARVED_MIN
from primus_lib.scaling.step import reader_for, scaling_step
from primus_lib.train.runtime.trainer import Trainer, TrainerOptions
from tests.train.conftest import START, make_job

# The data tasks run inside the pytest process, whose RSS depends on what the whole suite has
# imported (several GiB with torch and Airflow): give the role room so utilisation stays < 1.
ROLES = {
    "data_executor": {"replicas": 1, "min_replicas": 1, "max_replicas": 4, "cpu": 1, "memory": "64Gi"},
    "trainer": {"replicas": 1, "cpu": 1, "memory": "1Gi"},
}
SCALING = {"horizontal": {"enabled": True, "threshold": 0.5, "cooldown": "60s"}, "vertical": {"enabled": False}}


@pytest.fixture
def scaled_job(tmp_path, monkeypatch):
    _, job = make_job(tmp_path, monkeypatch, mode="offline", hours=3, lag="0h", rows=120, roles=ROLES, scaling=SCALING)
    return job


def test_trainer_and_data_tasks_feed_the_scaler(scaled_job, caplog):
    job = scaled_job
    for hour in range(2):  # the mapped data tasks' work, then the Sink's commit (the 3rd hour never comes)
        run_window(job, "history", START + timedelta(hours=hour), workers=1)
    metrics_dir = Path(JobPaths.for_job(job).metrics_dir)  # a local job's directory
    executors = sorted(p.name for p in metrics_dir.glob("data_executor-*.prom"))
    assert len(executors) >= 2  # one snapshot per task, named by task id

    summary = Trainer(job, TrainerOptions(poll_interval=0.01, idle_exit=0.5, prefetch=False)).run()
    assert "2 windows consumed" in summary
    trainer_file = metrics_dir / "trainer-0.prom"
    text = trainer_file.read_text()
    assert 'primus_trainer_starved_ratio{primus_job="tiny",role="trainer",worker="0"}' in text
    assert "primus_trainer_samples_total" in text

    reader = reader_for(job, "data_executor", None)
    assert isinstance(reader, TextfileReader)
    snap = reader.snapshot()
    assert snap is not None and snap.executors == len(executors)
    assert snap.memory_bytes_max > 10 * 2**20  # the tasks' real RSS
    assert 0.0 < snap.memory < 1.0  # against the role's 64Gi
    assert snap.memory == pytest.approx(snap.memory_bytes_max / (64 * 2**30), rel=0.5)
    # each task saw the windows committed but not trained yet, over 3 windows ahead: the first
    # window's tasks none, the second's one (the trainer ran after both)
    assert 0.0 < snap.buffer <= 1 / 3 + 1e-9
    assert snap.trainer_starved > 0.0  # it waited for the third window until idle_exit

    with caplog.at_level(logging.INFO, logger="primus.scaling"):
        decisions = scaling_step(job)
    messages = [r.getMessage() for r in caplog.records if r.name == "primus.scaling"]
    assert not any("no metrics" in m for m in messages)
    expected = {k: v for k, v in snap.to_dict().items() if k != "at"}
    if decisions:
        inputs = decisions[0].inputs
    else:
        (hold,) = [m for m in messages if " hold, inputs " in m]
        inputs = json.loads(hold.split(" hold, inputs ", 1)[1])
    assert {k: inputs[k] for k in expected} == pytest.approx(expected)
    # buffers nearly dry, one replica of at most 4: the horizontal policy adds while the trainer
    # starves (STARVED_MIN of its time waiting) and holds otherwise
    assert [d.action for d in decisions] == (["scale_up"] if snap.trainer_starved >= STARVED_MIN else [])


def test_metrics_failures_do_not_fail_a_data_task(scaled_job):
    job = scaled_job
    metrics_dir = Path(JobPaths.for_job(job).metrics_dir)  # a local job's directory
    metrics_dir.parent.mkdir(parents=True, exist_ok=True)
    metrics_dir.write_text("not a directory")  # every snapshot write fails
    result = run_window(job, "history", START, workers=1)
    assert result.queued.rows > 0
    assert metrics_dir.is_file()


def test_task_metrics_skip_jobs_without_a_data_executor_role(tmp_path, monkeypatch):
    _, job = make_job(tmp_path, monkeypatch, hours=1)
    assert TaskMetrics.start(job, "history/x/impressions/0") is None


def test_a_slow_trainer_with_data_waiting_reports_back_pressure(tmp_path, monkeypatch):
    from primus_lib.metrics import names as n
    from tests.train.conftest import commit_windows

    _, job = make_job(tmp_path, monkeypatch, mode="offline", hours=3, rows=800)
    assert sum(commit_windows(job, range(3))) > 20 * job.spec.training.batch_size  # more than it will train
    options = TrainerOptions(poll_interval=0.01, max_steps=12, step_delay=0.05, high_water=2)
    trainer = Trainer(job, options)
    trainer.run()
    text = (JobPaths.for_job(job).metrics_dir / "trainer-0.prom").read_text()
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("primus_trainer_")
    }
    assert values[n.TRAINER_BACKPRESSURE] > 0.5  # its read-ahead stayed full: the data waited on it
    assert values[n.TRAINER_STARVED] < 0.5
    assert values[n.TRAINER_SAMPLES] == 12 * job.spec.training.batch_size
