"""A Primus DAG whose sources are on S3 (SeaweedFS) behind an Airflow connection, run by the shared
``airflow standalone`` (scheduler, LocalExecutor workers, triggerer) whose environment has no
``AWS_*`` variable. The clicks partition is completed only once its source task is deferred, so
the triggerer has to resolve the connection itself (stored in the metadata database through the
REST API, read through the triggerer's supervisor) to see the partition; the run then succeeds.
"""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import quote

import pytest

from devstack.demo import wait_for_dag
from tests.fixtures.airflow import make_job, sync_dag_stubs
from tests.fixtures.specs import airflow_doc, batch_stream, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB, CONN_ID = "s3-deferred", "primus_s3_deferred"
SOURCE_TASK = "history.source_clicks"


def _upload_window(s3_server, tmp_path, bucket: str) -> None:
    """Window 00:00 of both sources, without the clicks partition's success marker."""
    local = make_job(tmp_path / "local", name="s3-local", end="2026-11-01T01:00:00Z", rows_per_hour=60)
    fs = s3_server.filesystem()
    fs.create_dir(bucket)
    for path in sorted(local.data.rglob("*")):
        key = f"{bucket}/{path.relative_to(local.data)}"
        if path.is_file() and path.parent.name == "00" and key != f"{bucket}/clicks/20261101/00/_SUCCESS":
            fs.open_output_stream(key).write(path.read_bytes())


def _task_state(api, run_id: str, task_id: str) -> str | None:
    from primus_lib.airflow_api import AirflowApiError

    base = f"/api/v2/dags/{JOB}/dagRuns/{quote(run_id, safe='')}/taskInstances"
    try:
        return api.request("GET", f"{base}/{quote(task_id, safe='')}").get("state")
    except AirflowApiError:  # not scheduled yet
        return None


def _wait(what: str, check, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f}s"
        time.sleep(2)
    return found


def test_the_triggerer_resolves_the_s3_sources_connection_and_the_run_succeeds(airflow_server, s3_server, tmp_path):
    server, api = airflow_server, airflow_server.api()
    assert not [key for key in server.env if key.startswith("AWS_")]  # the triggerer's environment
    bucket = f"deferred-{uuid.uuid4().hex[:8]}"
    _upload_window(s3_server, tmp_path, bucket)
    stream = batch_stream(f"s3://{bucket}", connection_id=CONN_ID)
    extra = json.dumps({"endpoint_url": s3_server.url, "region_name": "us-east-1"})
    keys = {"login": s3_server.access_key, "password": s3_server.secret_key}
    api.request("POST", "/api/v2/connections", {"connection_id": CONN_ID, "conn_type": "aws", "extra": extra, **keys})
    write_spec(server.job.jobs_dir / f"{JOB}.yaml", airflow_doc(JOB, hours=1, streams=[stream]))
    sync_dag_stubs(server.env, server.job.dags)
    wait_for_dag(api, JOB, timeout=180)
    api.set_paused(JOB, False)  # the timer's window is long past and catchup is off: no scheduled run
    try:
        body = {"logical_date": "2026-11-01T00:00:00Z", "conf": {"mode": "skip"}}  # data only, no trainer
        run_id = api.request("POST", f"/api/v2/dags/{JOB}/dagRuns", body)["dag_run_id"]

        def deferred() -> bool:
            state = _task_state(api, run_id, SOURCE_TASK)
            assert state not in ("failed", "upstream_failed", "success"), f"{SOURCE_TASK} {state} before deferring"
            return state == "deferred"

        _wait(f"{SOURCE_TASK} deferred", deferred)
        s3_server.filesystem().open_output_stream(f"{bucket}/clicks/20261101/00/_SUCCESS").close()

        def finished() -> dict | None:
            found = api.request("GET", f"/api/v2/dags/{JOB}/dagRuns/{quote(run_id, safe='')}")
            return found if found["state"] in ("success", "failed") else None

        run = _wait("the run's end", finished)
        base = f"/api/v2/dags/{JOB}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        states = {ti["task_id"]: ti["state"] for ti in api.request("GET", base)["task_instances"]}
        assert run["state"] == "success", states
        source = api.request("GET", f"{base}/{quote(SOURCE_TASK, safe='')}")
        assert source["try_number"] == 1, source  # resumed by the trigger's event, not planned by a retry
        units = api.request("GET", f"{base}/{quote(SOURCE_TASK, safe='')}/xcomEntries/return_value")["value"]
        units = json.loads(units) if isinstance(units, str) else units  # the planned tasks in units
        tasks = [task for unit in units for task in unit]
        assert tasks and all(t["uri"].startswith(f"s3://{bucket}/clicks/20261101/00/") for t in tasks), units
    finally:
        api.set_paused(JOB, True)
