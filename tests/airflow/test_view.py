"""The Primus view's endpoints in the real API server (``airflow standalone`` on PostgreSQL, job
af-backfill): refused without Airflow's credentials, served with them, and what they serve is
the job's state after windows were trained through a real backfill."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass(frozen=True)
class Trained:
    """The shared server after at least two of af-backfill's windows were trained."""

    server: Any
    token: str
    consumed: dict[str, dict]  # progress.json's consumed entries when the fixture finished

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(self.server.url + path, timeout=60, **kwargs)

    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def token(server) -> str:
    """A JWT from the simple auth manager, as the UI and primus_lib.airflow_api get one."""
    reply = requests.post(
        f"{server.url}/auth/token", json={"username": "admin", "password": server.password}, timeout=30
    )
    assert reply.status_code in (200, 201), reply.text
    return reply.json()["access_token"]


def job_consumed(server) -> dict[str, dict]:
    from primus_lib.paths import JobPaths
    from primus_lib.progress import read_progress
    from primus_lib.spec import load_job

    with pytest.MonkeyPatch.context() as mp:
        for key, value in server.job.env.items():
            mp.setenv(key, value)  # PRIMUS_HOME: where the job's state is
        return read_progress(JobPaths.for_job(load_job(server.job.spec)).progress)["consumed"]


@pytest.fixture(scope="module")
def trained(airflow_server) -> Trained:
    """Train the first two windows through ``primus backfill`` (the real scheduler, data tasks and
    deferred trainer) unless an earlier test of the session already did."""
    from primus_lib.resources import backend_for
    from primus_lib.spec import load_job

    server = airflow_server
    if len(job_consumed(server)) < 2:
        # the password: the connection in server.env ($AIRFLOW_CONN_PRIMUS_AIRFLOW_API), never argv
        command = [
            sys.executable,
            "-m",
            "primus_lib.cli.main",
            "backfill",
            str(server.job.spec),
            "--api",
            server.url,
            "--wait",
            "--timeout",
            "420",
            "--from",
            "2026-11-01T00:00Z",
            "--to",
            "2026-11-01T02:00Z",
        ]
        try:
            done = subprocess.run(command, env=server.env, capture_output=True, text=True, timeout=480)
        finally:
            with pytest.MonkeyPatch.context() as mp:
                for key, value in server.job.env.items():
                    mp.setenv(key, value)
                backend_for(load_job(server.job.spec), str(server.job.spec)).stop()  # the trainer service
        assert done.returncode == 0, done.stdout + done.stderr
    consumed = job_consumed(server)
    assert len(consumed) >= 2, consumed
    return Trained(server, token(server), consumed)


def test_the_endpoints_refuse_a_request_without_airflow_credentials(airflow_server):
    url = airflow_server.url
    for path in ("/primus/api/jobs", "/primus/api/jobs/af-backfill", "/primus/ui/af-backfill", "/primus/ui/"):
        reply = requests.get(url + path, timeout=30)
        assert reply.status_code == 401, (path, reply.status_code, reply.text[:200])
        assert reply.json() == {"detail": "Not authenticated"}  # nothing of the job
    forged = requests.get(
        url + "/primus/api/jobs/af-backfill", headers={"Authorization": "Bearer not-a-jwt"}, timeout=30
    )
    assert forged.status_code == 403
    assert (
        requests.get(url + "/primus/api/jobs/af-backfill", cookies={"_token": "not-a-jwt"}, timeout=30).status_code
        == 403
    )
    assert requests.get(url + "/primus/static/primus.js", timeout=30).status_code == 200  # code only, no data


def test_the_plugin_registers_the_view_in_the_ui(airflow_server):
    api = airflow_server.api()
    plugins = api.request("GET", "/api/v2/plugins")["plugins"]
    primus = next(p for p in plugins if p["name"] == "primus")
    views = {v["url_route"]: v for v in primus["external_views"]}
    assert views["primus"]["destination"] == "dag" and views["primus"]["href"] == "primus/ui/{DAG_ID}"
    assert views["primus-jobs"]["destination"] == "nav"
    assert any(app["url_prefix"] == "/primus" for app in primus["fastapi_apps"])


def test_an_authenticated_request_gets_the_job_state(trained):
    jobs = trained.get("/primus/api/jobs", headers=trained.bearer())
    assert jobs.status_code == 200 and "af-backfill" in jobs.json()

    reply = trained.get("/primus/api/jobs/af-backfill", headers=trained.bearer())
    assert reply.status_code == 200, reply.text
    view = reply.json()
    assert (view["job"], view["window"], view["training_mode"]) == ("af-backfill", "1h", "offline")
    # one metrics point per trained window, the values the trainer wrote into progress.json
    assert {f"{m['stream']}/{m['window']}": m["auc"] for m in view["metrics"]} == {
        key: entry["auc"] for key, entry in trained.consumed.items()
    }
    assert all(0.0 <= m["auc"] <= 1.0 and m["logloss"] > 0 for m in view["metrics"])
    rows = {w["window"]: w for w in view["windows"]}
    for key in trained.consumed:
        window = rows[key.split("/", 1)[1]]
        assert window["state"] == "trained" and window["run"]["state"] == "success"
        assert window["streams"]["history"]["committed_rows"] > 0
        assert sum(window["streams"]["history"]["tasks"].values()) > 0  # planned in the task ledger
        assert window["run"]["data_tasks"].get("success", 0) > 0  # run as mapped Airflow tasks
    assert view["trainer"]["newest_trained"] == max(k.split("/", 1)[1] for k in trained.consumed)
    assert view["executors"]["data_executor"]["replicas"] == 2  # the job's Airflow pool (2 slots)
    assert view["dtgg"]["mermaid"].startswith("flowchart LR") and "history" in view["dtgg"]["mermaid"]

    # the UI's way: the JWT in the _token cookie, and the page itself
    cookie = trained.get("/primus/api/jobs/af-backfill", cookies={"_token": trained.token})
    assert cookie.status_code == 200 and cookie.json()["job"] == "af-backfill"
    page = trained.get("/primus/ui/af-backfill", cookies={"_token": trained.token})
    assert page.status_code == 200 and 'data-dag-id="af-backfill"' in page.text


def test_an_unknown_dag_is_a_clear_404(trained):
    reply = trained.get("/primus/api/jobs/no-such-job", headers=trained.bearer())
    assert reply.status_code == 404 and "no Primus job" in reply.json()["detail"]
