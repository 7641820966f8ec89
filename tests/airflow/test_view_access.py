"""Per-DAG access to the Primus view under the FAB auth manager (apache-airflow-providers-fab), the
auth manager with per-DAG permissions: a real ``airflow api-server`` on PostgreSQL serving two
Primus jobs, roles made through FAB's own REST API as an administrator would (``can_read`` on
``DAG:<dag_id>`` plus ``DAG Runs``), and a JWT per user from ``POST /auth/token``.

A user with read access to one job sees and opens that job only; a user whose role grants the DAG
but not its runs sees no job (the list offers only what the job's route would serve); a user with
no DAG permission gets 403 from every route that shows a job.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.fixtures._proc import free_port, start, stop
from tests.fixtures.airflow import airflow_binary, airflow_env, make_job, sync_dag_stubs
from tests.fixtures.specs import airflow_doc, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.airflow, pytest.mark.postgres]

FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
JOB_A, JOB_B = "fab-a", "fab-b"
ADMIN_PASSWORD = "fab-test-admin"


def _reads(*resources: str) -> list[dict]:
    """A role's permissions in FAB's REST form: ``can_read`` on each resource."""
    return [{"action": {"name": "can_read"}, "resource": {"name": name}} for name in resources]


ROLES = {
    "fab-a-reader": _reads(f"DAG:{JOB_A}", "DAG Runs"),
    "fab-a-dag-only": _reads(f"DAG:{JOB_A}"),
    "no-dags": _reads("My Profile"),
}
USERS = {"alice": "fab-a-reader", "dora": "fab-a-dag-only", "nico": "no-dags"}


@dataclass
class FabServer:
    url: str
    admin_token: str = ""

    def token(self, username: str, password: str) -> str:
        reply = requests.post(f"{self.url}/auth/token", json={"username": username, "password": password}, timeout=60)
        assert reply.status_code in (200, 201), reply.text
        return reply.json()["access_token"]

    def get(self, path: str, token: str) -> requests.Response:
        return requests.get(self.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def post(self, path: str, body: dict) -> None:
        """As the administrator (FAB's REST API for roles and users)."""
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        reply = requests.post(self.url + path, headers=headers, json=body, timeout=60)
        assert reply.status_code in (200, 201), (path, reply.status_code, reply.text)

    def tokens(self) -> dict[str, str]:
        return {name: self.token(name, _password(name)) for name in USERS}


def _password(username: str) -> str:
    return f"{username}-fab-test"


def _airflow(binary: Path, env: dict[str, str], log: Path, *args: str) -> None:
    with open(log, "ab") as handle:
        done = subprocess.run([str(binary), *args], env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=600)
    assert done.returncode == 0, f"airflow {args[0]} {args[1]} failed:\n{log.read_text(errors='replace')[-3000:]}"


@pytest.fixture(scope="module")
def fab_server(tmp_path_factory: pytest.TempPathFactory, postgres_server):
    """Two Primus jobs (fab-a, fab-b) serialized by ``airflow dags reserialize`` (which, under the FAB
    auth manager, creates their ``DAG:<id>`` resources), an admin from ``airflow users create``, the
    api-server alone (the view needs nothing else), then the roles and users through its REST API."""
    binary = airflow_binary()
    root = tmp_path_factory.mktemp("airflow-fab")
    job = make_job(root / "job", name=JOB_A, end="2026-11-01T01:00:00Z", rows_per_hour=20)
    write_spec(job.jobs_dir / f"{JOB_B}.yaml", airflow_doc(JOB_B, hours=1))
    port = free_port()
    env = airflow_env(
        root / "home",
        job,
        AIRFLOW__CORE__AUTH_MANAGER=FAB,
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgres_server.create_database("airflow_fab"),
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__API__WORKERS="1",
        AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
    )
    log = root / "setup.log"
    _airflow(binary, env, log, "db", "migrate")
    sync_dag_stubs(env, job.dags)
    _airflow(binary, env, log, "dags", "reserialize")
    admin = ["--username", "admin", "--password", ADMIN_PASSWORD, "--role", "Admin"]
    names = ["--firstname", "Ada", "--lastname", "Admin", "--email", "admin@example.org"]
    _airflow(binary, env, log, "users", "create", *admin, *names)

    def healthy() -> bool:
        body = requests.get(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2).json()
        return body["metadatabase"]["status"] == "healthy"

    proc = start([str(binary), "api-server"], root / "api-server.log", healthy, timeout=240, env=env)
    try:
        server = FabServer(f"http://127.0.0.1:{port}")
        server.admin_token = server.token("admin", ADMIN_PASSWORD)
        for name, actions in ROLES.items():
            server.post("/auth/fab/v1/roles", {"name": name, "actions": actions})
        for name, role in USERS.items():
            names = {"first_name": name, "last_name": "Test", "email": f"{name}@example.org"}
            server.post(
                "/auth/fab/v1/users",
                {"username": name, "password": _password(name), **names, "roles": [{"name": role}]},
            )
        yield server
    finally:
        stop(proc, timeout=30)


def test_a_user_with_one_jobs_role_sees_and_opens_that_job_only(fab_server):
    tokens = fab_server.tokens()
    everything = fab_server.get("/primus/api/jobs", fab_server.admin_token)
    assert everything.status_code == 200 and everything.json() == [JOB_A, JOB_B]

    alice = tokens["alice"]
    listed = fab_server.get("/primus/api/jobs", alice)
    assert listed.status_code == 200 and listed.json() == [JOB_A]
    view = fab_server.get(f"/primus/api/jobs/{JOB_A}", alice)
    assert view.status_code == 200, view.text
    assert view.json()["job"] == JOB_A
    assert fab_server.get(f"/primus/ui/{JOB_A}", alice).status_code == 200
    for path in (f"/primus/api/jobs/{JOB_B}", f"/primus/ui/{JOB_B}"):
        reply = fab_server.get(path, alice)
        assert reply.status_code == 403, (path, reply.status_code, reply.text[:200])
        assert reply.json() == {"detail": "Forbidden"}  # nothing of the job
    # Airflow's own API agrees: the same role reads the same single DAG
    dags = fab_server.get("/api/v2/dags", alice).json()["dags"]
    assert [d["dag_id"] for d in dags] == [JOB_A]


def test_the_list_offers_only_jobs_whose_runs_the_user_may_read(fab_server):
    dora = fab_server.tokens()["dora"]  # DAG:fab-a readable, DAG Runs not
    listed = fab_server.get("/primus/api/jobs", dora)
    assert listed.status_code == 200 and listed.json() == []
    assert fab_server.get(f"/primus/api/jobs/{JOB_A}", dora).status_code == 403


def test_a_user_without_any_dag_permission_gets_403_everywhere_a_job_shows(fab_server):
    nico = fab_server.tokens()["nico"]
    jobs = [f"/primus/{kind}/{dag_id}" for kind in ("api/jobs", "ui") for dag_id in (JOB_A, JOB_B)]
    for path in ["/primus/api/jobs", *jobs]:
        reply = fab_server.get(path, nico)
        assert reply.status_code == 403, (path, reply.status_code, reply.text[:200])
        assert reply.json() == {"detail": "Forbidden"}
    page = fab_server.get("/primus/ui/", nico)  # the page shell of the list: no job in it
    assert page.status_code == 200 and JOB_A not in page.text
