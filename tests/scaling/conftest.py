"""A real Airflow API server (``airflow api-server`` on SQLite, no scheduler) for the pool API tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures._proc import free_port, start, stop
from tests.resources.conftest import job_env  # noqa: F401 - the fixture, shared with tests/resources

VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class AirflowAPI:
    url: str
    username: str
    password: str


@pytest.fixture(scope="session")
def airflow_api_server(tmp_path_factory) -> AirflowAPI:
    home = tmp_path_factory.mktemp("airflow-api")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__API__WORKERS="1",
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin", AIRFLOW__API__HOST="127.0.0.1",
               AIRFLOW__API__PORT=str(port), AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"))  # fmt: skip
    subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)

    def healthy() -> bool:
        import requests

        return requests.get(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2).status_code == 200

    proc = start([str(VENV_BIN / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(port)],
                 home / "api-server.log", healthy, timeout=120, env=env)  # fmt: skip
    try:
        password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        yield AirflowAPI(f"http://127.0.0.1:{port}", "admin", password)
    finally:
        stop(proc, timeout=30)
