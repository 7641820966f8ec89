"""The live stack of the embedded default: ``make up`` / ``make down`` / ``python -m devstack.stack status``.

    python -m devstack.stack up|down|status [--dir DIR]

``up`` starts, in the background and only what is not already running (a second ``up`` is a
no-op that prints the same addresses): PostgreSQL (Airflow's metadata database), Apache Kafka
(KRaft, ``devstack.kafka``), Prometheus, and Airflow 3.3 as api-server, scheduler (LocalExecutor),
dag-processor and triggerer; it waits until each is healthy, then prints the UI address and the
admin login. ``down`` stops them (and the roles a job's local backend started) and keeps all
state, so the next ``up`` finds every DAG run, variable, topic and metric again.

The API of the stack (other tools start it with ``python -m devstack.stack up``):

- state: ``$PRIMUS_STACK_DIR`` (default ``<repo>/.primus/stack``, gitignored): ``run/*.pid`` (pid +
  start time per server; each runs in its own process group), ``logs/*.log`` (the servers'
  output), ``postgres/``, ``kafka/``, ``prometheus/``, ``airflow/`` (AIRFLOW_HOME, task logs in
  ``airflow/logs``), ``primus/`` (PRIMUS_HOME), ``data/`` (PRIMUS_DATA), ``stack.json`` (the
  addresses) and ``env.sh``: ``source`` it to talk to the stack (AIRFLOW_HOME, the database URL,
  PRIMUS_AIRFLOW_API, PRIMUS_AIRFLOW_PASSWORD, PRIMUS_PROMETHEUS_URL, PRIMUS_KAFKA, ...).
- ports (127.0.0.1; a port held by something that is not this stack fails ``up`` with one
  line naming it): ``PRIMUS_STACK_AIRFLOW_PORT`` (8080), ``PRIMUS_STACK_KAFKA_PORT`` (19092),
  ``PRIMUS_STACK_KAFKA_CONTROLLER_PORT`` (19093), ``PRIMUS_STACK_POSTGRES_PORT`` (15432),
  ``PRIMUS_STACK_PROMETHEUS_PORT`` (19090), ``PRIMUS_STACK_WORKER_LOG_PORT`` (18793),
  ``PRIMUS_STACK_TRIGGER_LOG_PORT`` (18794).
- ``PRIMUS_STACK_PASSWORD`` (the admin password of Airflow, Prometheus and Kafka, default
  ``primus-admin``; the connections ``primus_airflow_api``, ``primus_prometheus`` and
  ``primus_kafka`` carry it),
  ``PRIMUS_STACK_DAGS_DIR`` (default ``<repo>/dags``), ``PRIMUS_JOBS_DIR`` (default
  ``<repo>/config/jobs``), ``PRIMUS_STACK_PARALLELISM`` (Airflow task slots, default 3),
  ``PRIMUS_CACHE`` (the Kafka jars, default ``~/.cache/primus``).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from devstack.airflow import USER, Airflow, airflow_env
from devstack.daemon import Daemon
from devstack.kafka import PASSWORD_ENV, Login
from devstack.postgres import Postgres
from devstack.proc import port_free
from devstack.prometheus import Prometheus

ROOT = Path(__file__).resolve().parents[1]
NAME = "devstack.stack"


@dataclass(frozen=True)
class Settings:
    dir: Path
    airflow_port: int
    kafka_port: int
    kafka_controller_port: int
    postgres_port: int
    prometheus_port: int
    worker_log_port: int
    trigger_log_port: int
    password: str
    dags_dir: Path
    jobs_dir: Path

    @classmethod
    def from_env(cls, directory: Path | None = None) -> Settings:
        env = os.environ.get
        return cls(
            dir=(directory or Path(env("PRIMUS_STACK_DIR") or ROOT / ".primus" / "stack")).absolute(),
            airflow_port=int(env("PRIMUS_STACK_AIRFLOW_PORT", "8080")),
            kafka_port=int(env("PRIMUS_STACK_KAFKA_PORT", "19092")),
            kafka_controller_port=int(env("PRIMUS_STACK_KAFKA_CONTROLLER_PORT", "19093")),
            postgres_port=int(env("PRIMUS_STACK_POSTGRES_PORT", "15432")),
            prometheus_port=int(env("PRIMUS_STACK_PROMETHEUS_PORT", "19090")),
            worker_log_port=int(env("PRIMUS_STACK_WORKER_LOG_PORT", "18793")),
            trigger_log_port=int(env("PRIMUS_STACK_TRIGGER_LOG_PORT", "18794")),
            password=env("PRIMUS_STACK_PASSWORD", "primus-admin"),
            dags_dir=Path(env("PRIMUS_STACK_DAGS_DIR") or ROOT / "dags").absolute(),
            jobs_dir=Path(env("PRIMUS_JOBS_DIR") or ROOT / "config" / "jobs").absolute(),
        )


class Stack:
    def __init__(self, settings: Settings) -> None:
        self.s = s = settings
        self.run_dir, self.log_dir = s.dir / "run", s.dir / "logs"
        self.postgres = Postgres(s.dir / "postgres", s.postgres_port, self.run_dir, self.log_dir)
        self.prometheus = Prometheus(
            s.dir / "prometheus",
            s.prometheus_port,
            self.run_dir,
            self.log_dir,
            USER,
            s.password,
            s.dir / "secrets" / "metrics.token",  # the roles' /metrics serve only to it
        )
        self.kafka = Daemon("kafka", self.run_dir, self.log_dir)
        self.kafka_login = Login(USER, s.password)  # the broker asks every client for it (SCRAM-SHA-256)
        self.airflow = Airflow(s.dir / "airflow", s.airflow_port, self.run_dir, self.log_dir, s.password)

    # -- what clients need ----------------------------------------------------------------------
    def client_env(self) -> dict[str, str]:
        """The variables of ``<dir>/env.sh``: Airflow's (for its CLI) and the stack's addresses."""
        s = self.s
        return {
            "AIRFLOW_HOME": str(self.airflow.home),
            "AIRFLOW__API__PORT": str(s.airflow_port),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.postgres.url,
            "AIRFLOW__CORE__DAGS_FOLDER": str(s.dags_dir),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(s.worker_log_port),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(s.trigger_log_port),
            "AIRFLOW_CONN_PRIMUS_AIRFLOW_API": self.airflow.connection(),
            "AIRFLOW_CONN_PRIMUS_PROMETHEUS": self.prometheus.connection(),
            "AIRFLOW_CONN_PRIMUS_KAFKA": self.kafka_connection(),
            "PRIMUS_SECRETS_DIR": str(self.secrets_dir()),  # the same connection for `primus backfill`
            "PRIMUS_ROOT": str(ROOT),
            "PRIMUS_HOME": str(s.dir / "primus"),
            "PRIMUS_DATA": str(s.dir / "data"),
            "PRIMUS_JOBS_DIR": str(s.jobs_dir),
            "PRIMUS_AIRFLOW_API": self.airflow.url,
            "PRIMUS_AIRFLOW_USER": USER,
            "PRIMUS_AIRFLOW_PASSWORD": s.password,
            "PRIMUS_PROMETHEUS_URL": self.prometheus.url,
            "PRIMUS_KAFKA": f"127.0.0.1:{s.kafka_port}",
            "PRIMUS_STACK_DIR": str(s.dir),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def kafka_connection(self) -> str:
        """The broker as the connection ``primus_kafka`` (the demo spec's Kafka source names it)."""
        return json.dumps(self.kafka_login.connection(f"127.0.0.1:{self.s.kafka_port}"))

    def secrets_dir(self) -> Path:
        """The stack's mounted connections (docs/contracts.md): ``primus_airflow_api.json``,
        ``primus_prometheus.json`` and ``primus_kafka.json``; and ``metrics.token``, Prometheus's
        scrape token."""
        directory = self.s.dir / "secrets"
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (directory / "primus_airflow_api.json").write_text(self.airflow.connection())
        (directory / "primus_prometheus.json").write_text(self.prometheus.connection())
        (directory / "primus_kafka.json").write_text(self.kafka_connection())
        self.prometheus.metrics_token()
        return directory

    def write_client_files(self) -> None:
        env = self.client_env()
        lines = ["# Written by `python -m devstack.stack up`: `source` it to talk to the live stack."]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in env.items() if key != "PATH"]
        lines.append(f'export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"')
        (self.s.dir / "env.sh").write_text("\n".join(lines) + "\n")
        info = {
            **asdict(self.s),
            "dir": str(self.s.dir),
            "dags_dir": str(self.s.dags_dir),
            "jobs_dir": str(self.s.jobs_dir),
            "airflow_url": self.airflow.url,
            "prometheus_url": self.prometheus.url,
            "user": USER,
        }
        (self.s.dir / "stack.json").write_text(json.dumps(info, indent=1) + "\n")

    # -- up ---------------------------------------------------------------------------------------
    def _ports(self) -> list[tuple[str, int, bool]]:
        """(what, port, ours-running) for every port the stack listens on."""
        s, af = self.s, self.airflow.running()
        return [
            ("PostgreSQL", s.postgres_port, self.postgres.daemon.pid() is not None),
            ("Kafka", s.kafka_port, self.kafka.pid() is not None),
            ("Kafka controller", s.kafka_controller_port, self.kafka.pid() is not None),
            ("Prometheus", s.prometheus_port, self.prometheus.daemon.pid() is not None),
            ("Airflow API server", s.airflow_port, af["api-server"] is not None),
            ("Airflow worker log server", s.worker_log_port, af["scheduler"] is not None),
            ("Airflow triggerer log server", s.trigger_log_port, af["triggerer"] is not None),
        ]

    def check_ports(self) -> None:
        for what, port, ours in self._ports():
            if not ours and not port_free(port):
                raise PortTaken(
                    f"127.0.0.1:{port} ({what}) is in use by something that is not this stack "
                    f"(no running server recorded in {self.run_dir}): stop it, or choose another port "
                    "(see `python -m devstack.stack --help`)"
                )

    def up(self, timeout: float = 300.0) -> None:
        s = self.s
        for sub in ("run", "logs", "airflow", "primus", "data"):
            (s.dir / sub).mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            s.dir.chmod(0o755)  # the postgres user must reach its cluster under it
        self.check_ports()
        env = airflow_env(self.client_env())
        self.airflow.write_password()
        self.write_client_files()
        kafka_mark = self._start_kafka()
        if self.prometheus.daemon.pid() is None:
            self.prometheus.start()
        if self.postgres.daemon.pid() is None:
            self.postgres.start()
        self.airflow.migrate(env, self.log_dir / "airflow-migrate.log")
        if self.airflow.running()["dag-processor"] is None:
            self.airflow.sync_dag_stubs(env)
        self.airflow.spawn(env)
        if kafka_mark is not None:
            self.kafka.wait_ready(lambda: "ready on" in self.kafka.log.read_text(errors="replace")[kafka_mark:], 120)
        deadline = time.monotonic() + timeout
        while not self._airflow_healthy():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Airflow not healthy within {timeout:.0f}s: {self._health_text()}; logs in {self.log_dir}"
                )
            time.sleep(1)

    def _start_kafka(self) -> int | None:
        """Spawn the broker's launcher unless it runs; the log offset its ready line will follow."""
        if self.kafka.pid() is not None:
            return None
        mark = self.kafka.log.stat().st_size if self.kafka.log.exists() else 0
        cache = os.environ.get("PRIMUS_CACHE") or os.environ.get("CACHE") or str(Path.home() / ".cache" / "primus")
        args = [
            sys.executable,
            "-m",
            "devstack.kafka",
            "run",
            "--port",
            str(self.s.kafka_port),
            "--controller-port",
            str(self.s.kafka_controller_port),
            "--dir",
            str(self.s.dir / "kafka"),
            "--user",
            self.kafka_login.user,
            "--cache",
            cache,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT), PASSWORD_ENV: self.kafka_login.password}
        self.kafka.spawn(args, env, cwd=ROOT)
        return mark

    def _airflow_healthy(self) -> bool:
        try:
            return self.airflow.healthy()
        except RuntimeError:
            raise
        except Exception:
            return False

    def _health_text(self) -> str:
        try:
            return json.dumps(self.airflow.health())
        except Exception as exc:
            return f"no answer ({exc})"

    # -- down / status ----------------------------------------------------------------------------
    def down(self) -> list[str]:
        stopped = [f"airflow {name}" for name in self.airflow.stop()]
        stopped += self._stop_job_roles()
        if self.kafka.stop(signal.SIGTERM, timeout=60):  # the launcher stops the broker cleanly
            stopped.append("kafka")
        if self.prometheus.stop():
            stopped.append("prometheus")
        if self.postgres.stop():
            stopped.append("postgres")
        return stopped

    def _stop_job_roles(self) -> list[str]:
        """The local backend's supervisors (trainers, stream executors) of the stack's jobs."""
        from primus_lib.resources.table import alive, read_json

        stopped = []
        env = {**os.environ, **self.client_env()}
        for desired in sorted((self.s.dir / "primus" / "jobs").glob("*/resources/desired.json")):
            supervisor = read_json(desired.parent / "supervisor.json")
            spec = (read_json(desired) or {}).get("spec_path")
            if not spec or not alive(supervisor):
                continue
            primus = Path(sys.executable).parent / "primus"
            subprocess.run([str(primus), "resources", "stop", spec], env=env, capture_output=True, timeout=120)
            stopped.append(f"job {desired.parent.parent.name} roles")
        return stopped

    def status(self) -> dict[str, dict]:
        rows = {
            "postgres": (self.postgres.daemon.pid(), f"127.0.0.1:{self.s.postgres_port}"),
            "kafka": (self.kafka.pid(), f"127.0.0.1:{self.s.kafka_port}"),
            "prometheus": (self.prometheus.daemon.pid(), self.prometheus.url),
        }
        for name, pid in self.airflow.running().items():
            rows[f"airflow-{name}"] = (pid, self.airflow.url if name == "api-server" else "")
        return {name: {"pid": pid, "address": address} for name, (pid, address) in rows.items()}

    def banner(self) -> str:
        s = self.s
        return "\n".join(
            [
                f"Airflow UI      {self.airflow.url}   login: {USER} / {s.password}",
                f"Kafka           127.0.0.1:{s.kafka_port}   login: {USER} / {s.password} (SASL SCRAM-SHA-256)",
                f"PostgreSQL      127.0.0.1:{s.postgres_port} (Airflow's metadata database)",
                f"Prometheus      {self.prometheus.url}   login: {USER} / {s.password}",
                f"state           {s.dir}   (source {s.dir / 'env.sh'} to use it; `make down` stops it)",
            ]
        )


class PortTaken(RuntimeError):
    """A port of the stack is held by a process the stack did not start."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {NAME}",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, help="state directory (default $PRIMUS_STACK_DIR or .primus/stack)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds `up` waits for Airflow's health")
    args = parser.parse_args(argv)
    settings = Settings.from_env(args.dir)
    try:
        stack = Stack(settings)
    except ValueError as exc:  # a stack password Kafka's login cannot carry
        print(f"{NAME}: PRIMUS_STACK_PASSWORD: {exc}", file=sys.stderr)
        return 2
    if args.command != "status":  # one up/down at a time per state dir
        stack.run_dir.mkdir(parents=True, exist_ok=True)
        lock = open(stack.run_dir / ".lock", "w")  # held until this process exits
        fcntl.flock(lock, fcntl.LOCK_EX)
    if args.command == "status":
        rows = stack.status()
        for name, row in rows.items():
            print(f"{name:<22} {'running' if row['pid'] else 'stopped':<8} {row['pid'] or '':<8} {row['address']}")
        return 0 if all(row["pid"] for row in rows.values()) else 3
    if args.command == "down":
        stopped = stack.down()
        print(
            f"{NAME}: stopped {', '.join(stopped) if stopped else 'nothing (not running)'}; state kept in {stack.s.dir}"
        )
        return 0
    try:
        stack.up(args.timeout)
    except PortTaken as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        print(f"{NAME}: up failed: {exc}", file=sys.stderr)
        print(f"{NAME}: what started is still running; `python -m {NAME} down` stops it", file=sys.stderr)
        return 1
    print(stack.banner())
    return 0


if __name__ == "__main__":
    sys.exit(main())
