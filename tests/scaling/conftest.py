"""A real Airflow API server (``airflow api-server``, no scheduler) for the pool API tests, its
metadata database a fresh database on the session's PostgreSQL (tests/fixtures/postgres.py)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

import pytest

from tests.fixtures._proc import free_port, start, stop
from tests.resources.conftest import job_env  # noqa: F401 - the fixture, shared with tests/resources


@dataclass(frozen=True)
class AirflowAPI:
    url: str
    username: str
    password: str


@pytest.fixture(scope="session")
def airflow_api_server(tmp_path_factory, postgres_server) -> AirflowAPI:
    from tests.fixtures.airflow import airflow_binary

    airflow = str(airflow_binary())
    home = tmp_path_factory.mktemp("airflow-api")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__API__WORKERS="1",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgres_server.create_database("airflow_api"),
    )
    done = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(
            f"airflow db migrate failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )

    def healthy() -> bool:
        import requests

        return requests.get(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2).status_code == 200

    proc = start(
        [airflow, "api-server", "--host", "127.0.0.1", "--port", str(port)],
        home / "api-server.log",
        healthy,
        timeout=120,
        env=env,
    )
    try:
        password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        yield AirflowAPI(f"http://127.0.0.1:{port}", "admin", password)
    finally:
        stop(proc, timeout=30)
