"""The DataSource operator packs a window's data tasks into units for the executor pool; a mapped
data task runs its unit (``primus_lib.data.dtgg.packing``)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.fixtures.airflow import make_job

CONTEXT = {"data_interval_start": datetime(2026, 11, 1, tzinfo=UTC), "params": {}}


def _files(tmp_path: Path, count: int):
    """A job whose first impressions hour holds ``count`` files (copies of the generated one)."""
    job = make_job(tmp_path, end="2026-11-01T01:00:00Z", rows_per_hour=60)
    hour = job.data / "impressions" / "20261101" / "00"
    for n in range(1, count):
        shutil.copy(hour / "part-00000.parquet", hour / f"part-{n:05d}.parquet")
    return job, hour


def test_units_one_per_executor_and_every_task_runs_once(tmp_path: Path, monkeypatch):
    from primus_operators.operators import PrimusDataSourceOperator, PrimusDataTaskOperator

    from primus_lib.allocation import allocations_dir
    from primus_lib.scaling.store import ScalingStore
    from primus_lib.spec import load_job

    job, hour = _files(tmp_path, 5)
    for key, value in job.env.items():
        monkeypatch.setenv(key, value)
    spec = str(job.jobs_dir / f"{job.name}.yaml")
    source = PrimusDataSourceOperator(
        task_id="source_impressions", spec_path=spec, stream="history", source="impressions"
    )

    units = source.execute(CONTEXT)  # the spec's 2 data executors
    assert [len(unit) for unit in units] == [3, 2]
    assert sorted(Path(t["path"]).name for unit in units for t in unit) == sorted(
        p.name for p in hour.glob("*.parquet")
    )

    ScalingStore(allocations_dir(load_job(spec)) / "data_executor").save({"allocation": {"replicas": 4}})
    units = source.execute(CONTEXT)  # the scaler's count now
    assert [len(unit) for unit in units] == [2, 1, 1, 1]

    outputs = [
        o
        for unit in units
        for o in PrimusDataTaskOperator(task_id="t", spec_path=spec, data_tasks=unit).execute(CONTEXT)
    ]
    rows = pq.read_metadata(hour / "part-00000.parquet").num_rows
    assert [o["rows"] for o in outputs] == [rows] * 5
    assert len({o["task_id"] for o in outputs}) == 5


def test_a_task_mapped_before_units_still_runs(tmp_path: Path, monkeypatch):
    """A DAG run planned by the previous release expanded over single task dicts."""
    from primus_operators.operators import PrimusDataSourceOperator, PrimusDataTaskOperator

    job, _ = _files(tmp_path, 1)
    for key, value in job.env.items():
        monkeypatch.setenv(key, value)
    spec = str(job.jobs_dir / f"{job.name}.yaml")
    [[raw]] = PrimusDataSourceOperator(
        task_id="source_impressions", spec_path=spec, stream="history", source="impressions"
    ).execute(CONTEXT)
    [output] = PrimusDataTaskOperator(task_id="t", spec_path=spec, data_tasks=raw).execute(CONTEXT)
    assert output["task_id"] == raw["id"] and output["rows"] > 0


def test_the_trainers_own_errors_fail_the_train_task_without_its_retries():
    """``train`` retries a try lost on the way (its worker, the metadata database restarting); a job
    that failed or timed out fails it at once with the job's error, as before it had retries."""
    from airflow.sdk.exceptions import AirflowFailException
    from primus_operators.operators import PrimusTrainerOperator

    train = PrimusTrainerOperator(task_id="train", spec_path="job.yaml", job_name="alpha", retries=2)
    for event in ({"status": "error", "message": "job alpha failed: trainer exited 3"}, {"status": "timeout"}):
        with pytest.raises(AirflowFailException) as failed:
            train.execute_complete(CONTEXT, event)
        assert str(failed.value) == event.get("message", f"trainer trigger failed: {event!r}")


def test_the_train_task_fails_at_once_with_the_jobs_error_when_the_trainer_failed(failing_trainer_job):
    """A failed job is reported, not restarted (``ensure_running``): it will consume no window, so
    the task neither waits in its worker nor defers; it fails with the job's error, as the trigger
    would have after its first check."""
    from airflow.sdk.exceptions import AirflowFailException
    from primus_operators.operators import PrimusTrainerOperator

    from primus_lib.resources import job_failure
    from tests.waiting import wait_for

    spec, backend = failing_trainer_job
    backend.submit()
    wait_for("the trainer's failure", lambda: job_failure(spec))
    train = PrimusTrainerOperator(task_id="train", spec_path=spec, job_name=backend.job.name, wait_in_worker=600)
    with pytest.raises(AirflowFailException) as failed:
        train.execute(CONTEXT)
    assert str(failed.value).startswith("trainer job failed: ") and "exit 3" in str(failed.value)
