"""Airflow 3.3 for the live stack: api-server, scheduler (LocalExecutor), dag-processor and
triggerer as four background processes on the stack's PostgreSQL, as in production.

The environment is config/airflow/env.sh then config/airflow/stack.sh (sourced by bash, so the
stack and a shell that sources ``<state>/env.sh`` see the same settings), plus what only the
stack knows: ports, the database URL, the admin password and the API connection the trainer's
task notes and the scaler's pool changes use (``AIRFLOW_CONN_PRIMUS_AIRFLOW_API``). The plugin
loads by its entry point (pyproject: primus_operators.plugin:PrimusPlugin).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from devstack.daemon import Daemon

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "airflow"
VENV_BIN = Path(sys.executable).parent
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
USER = "admin"


def airflow_env(settings: dict[str, str]) -> dict[str, str]:
    """os.environ (without AIRFLOW__ settings from elsewhere) + ``settings``, then env.sh and stack.sh."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__") and k != "AIRFLOW_HOME"}
    base.update(settings)
    script = f'set -a; source "{CONFIG / "env.sh"}"; source "{CONFIG / "stack.sh"}"; env -0'
    done = subprocess.run(["bash", "-c", script], env=base, capture_output=True, check=True, timeout=30)
    env = dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    env.update(settings)  # what the stack decided wins over the files' defaults (the DAG folder)
    return env


class Airflow:
    def __init__(self, home: Path, port: int, run_dir: Path, log_dir: Path, password: str) -> None:
        self.home, self.port, self.password = home, port, password
        self.daemons = {name: Daemon(f"airflow-{name}", run_dir, log_dir) for name in COMPONENTS}
        self.binary = VENV_BIN / "airflow"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connection(self) -> str:
        conn = {"conn_type": "http", "host": "127.0.0.1", "port": self.port, "login": USER, "password": self.password}
        return json.dumps(conn)

    def write_password(self) -> None:
        """The simple auth manager keeps existing users' passwords: a fixed, known admin password."""
        self.home.mkdir(parents=True, exist_ok=True)
        path = self.home / "simple_auth_manager_passwords.json.generated"
        path.write_text(json.dumps({USER: self.password}))

    def migrate(self, env: dict[str, str], log: Path) -> None:
        """``airflow db migrate`` once per Airflow version (a stamp in AIRFLOW_HOME)."""
        import airflow

        stamp = self.home / f".migrated-{airflow.__version__}"
        if stamp.exists():
            return
        with open(log, "ab") as handle:
            done = subprocess.run(
                [str(self.binary), "db", "migrate"], env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=600
            )
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"airflow db migrate failed ({done.returncode}); {log} ends with:\n{tail}")
        stamp.touch()

    def sync_dag_stubs(self, env: dict[str, str]) -> None:
        """The per-spec DAG stubs, written before the dag-processor's first listing."""
        script = Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) / "primus_dags.py"
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"{script} failed ({done.returncode}):\n{done.stdout[-1000:]}{done.stderr[-2000:]}")

    def running(self) -> dict[str, int | None]:
        return {name: daemon.pid() for name, daemon in self.daemons.items()}

    def spawn(self, env: dict[str, str]) -> None:
        """Start every component that is not running (the api-server first: the others call it)."""
        for name, daemon in self.daemons.items():
            if daemon.pid() is None:
                daemon.spawn([str(self.binary), name], env, cwd=self.home)

    def health(self) -> dict[str, str]:
        import requests

        body = requests.get(f"{self.url}/api/v2/monitor/health", timeout=3).json()
        return {key: (value or {}).get("status", "?") for key, value in body.items()}

    def healthy(self) -> bool:
        for name, daemon in self.daemons.items():
            if daemon.pid() is None:
                raise RuntimeError(f"airflow {name} exited; {daemon.log} ends with:\n{daemon.tail()}")
        wanted = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        status = self.health()
        return all(status.get(key) == "healthy" for key in wanted)

    def stop(self) -> list[str]:
        stopped = []
        for name in ("api-server", "dag-processor", "triggerer", "scheduler"):
            if self.daemons[name].stop(signal.SIGTERM, timeout=45):
                stopped.append(name)
        return stopped
