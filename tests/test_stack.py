"""The live stack (``python -m devstack.stack``, ``make up``/``make down``) on free ports in a temporary
state directory: every server healthy, a second ``up`` a no-op, and ``down``/``up`` keeps the
metadata database and the broker's topics. A port held by a stranger fails ``up`` in one line."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devstack.proc import free_port
from devstack.prometheus import authorized
from tests.fixtures._require import cache_dir, missing
from tests.fixtures.airflow import copy_dags

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "stack-test-admin"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.airflow,
    pytest.mark.postgres,
    pytest.mark.kafka,
    pytest.mark.prometheus,
]


def _require_servers() -> None:
    from devstack.kafka import KafkaUnavailable, kafka_classpath
    from devstack.postgres import bindir

    try:
        kafka_classpath(cache_dir())
        bindir()
    except (KafkaUnavailable, RuntimeError) as exc:
        missing(str(exc))
    if shutil.which("prometheus") is None:
        missing("prometheus not installed: run scripts/install-system.sh")


def _stack(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "devstack.stack", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _pids(state: Path) -> dict[str, int]:
    return {p.stem: json.loads(p.read_text())["pid"] for p in sorted((state / "run").glob("*.pid"))}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] != "Z"


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.status, reply.read()


@pytest.fixture
def stack_env(tmp_path: Path):
    _require_servers()
    state = Path(tempfile.mkdtemp(prefix="primus-stack-"))  # short: PostgreSQL's socket lives in it
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PRIMUS_"))}
    env.update(
        PRIMUS_STACK_DIR=str(state),
        PRIMUS_STACK_PASSWORD=PASSWORD,
        PRIMUS_STACK_DAGS_DIR=str(copy_dags(tmp_path / "dags")),
        PRIMUS_JOBS_DIR=str(jobs),
        PRIMUS_CACHE=str(cache_dir()),
        PRIMUS_STACK_PARALLELISM="2",
    )
    for name in ("AIRFLOW", "KAFKA", "KAFKA_CONTROLLER", "POSTGRES", "PROMETHEUS", "WORKER_LOG", "TRIGGER_LOG"):
        env[f"PRIMUS_STACK_{name}_PORT"] = str(free_port())
    try:
        yield state, env
    finally:
        done = _stack(env, "down", timeout=300)
        shutil.rmtree(state, ignore_errors=True)
        assert done.returncode == 0, done.stderr


def test_up_is_healthy_idempotent_and_down_up_keeps_the_state(stack_env):
    state, env = stack_env
    airflow = f"http://127.0.0.1:{env['PRIMUS_STACK_AIRFLOW_PORT']}"
    first = _stack(env, "up")
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"Airflow UI      {airflow}   login: admin / {PASSWORD}" in first.stdout
    pids = _pids(state)
    assert set(pids) == {
        "postgres",
        "kafka",
        "prometheus",
        "airflow-api-server",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    }
    assert all(_alive(pid) for pid in pids.values())

    # every service answers
    health = json.loads(_get(f"{airflow}/api/v2/monitor/health")[1])
    assert {k: v["status"] for k, v in health.items()} == dict.fromkeys(
        ("metadatabase", "scheduler", "triggerer", "dag_processor"), "healthy"
    )
    prometheus = f"http://127.0.0.1:{env['PRIMUS_STACK_PROMETHEUS_PORT']}"
    with pytest.raises(urllib.error.HTTPError) as refused:  # the stack's login, or nothing
        _get(f"{prometheus}/-/ready")
    assert refused.value.code == 401
    with urllib.request.urlopen(authorized(f"{prometheus}/-/ready", "admin", PASSWORD), timeout=10) as reply:
        assert reply.status == 200
    assert f"Prometheus      {prometheus}   login: admin / {PASSWORD}" in first.stdout
    from primus_lib.credentials import Connection, http_login
    from primus_lib.metrics.readers import PrometheusEndpoint, PrometheusReader

    mounted = json.loads((state / "secrets" / "primus_prometheus.json").read_text())
    login = http_login(Connection("primus_prometheus", **mounted))
    endpoint = PrometheusEndpoint.of(None, login, "primus_prometheus")
    assert endpoint.url == prometheus and PrometheusReader(endpoint, "any").query("vector(3)") == 3.0
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    from primus_lib.credentials import kafka_config

    bootstrap = f"127.0.0.1:{env['PRIMUS_STACK_KAFKA_PORT']}"
    with pytest.raises(KafkaException):  # the broker asks for a login
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=5)
    kafka = kafka_config(
        Connection("primus_kafka", **json.loads((state / "secrets" / "primus_kafka.json").read_text()))
    )
    assert kafka["bootstrap.servers"] == bootstrap and kafka["sasl.password"] == PASSWORD
    assert f"Kafka           {bootstrap}   login: admin / {PASSWORD}" in first.stdout
    assert json.loads(_client_env(state)["AIRFLOW_CONN_PRIMUS_KAFKA"]) == json.loads(
        (state / "secrets" / "primus_kafka.json").read_text()
    )
    admin = AdminClient(kafka)
    assert 1 in admin.list_topics(timeout=10).brokers
    admin.create_topics([NewTopic("stack-kept", 1, 1)])["stack-kept"].result(30)
    client_env = _client_env(state)
    import psycopg2

    url = client_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("postgresql+psycopg2://", "postgresql://")
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM alembic_version")  # Airflow's schema is migrated
        assert cur.fetchone() == (1,)

    # something in the metadata database that a restart must keep
    from primus_lib.airflow_api import AirflowApi

    api = AirflowApi(airflow, "admin", PASSWORD)
    api.request("POST", "/api/v2/variables", {"key": "primus-stack-test", "value": "kept"})

    again = _stack(env, "up")
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and _pids(state) == pids  # a no-op: same servers, same addresses
    assert _stack(env, "status").returncode == 0

    down = _stack(env, "down")
    assert down.returncode == 0, down.stderr
    assert not any(_alive(pid) for pid in pids.values())
    assert _pids(state) == {}
    assert _stack(env, "status").returncode == 3

    back = _stack(env, "up")
    assert back.returncode == 0, back.stdout + back.stderr
    assert set(_pids(state).values()).isdisjoint(pids.values())
    api = AirflowApi(airflow, "admin", PASSWORD)
    assert api.request("GET", "/api/v2/variables/primus-stack-test")["value"] == "kept"
    assert "stack-kept" in AdminClient(kafka).list_topics(timeout=10).topics


def _client_env(state: Path) -> dict[str, str]:
    """The variables ``<state>/env.sh`` exports, as a shell that sources it sees them."""
    done = subprocess.run(
        ["bash", "-c", f'set -a; source "{state}/env.sh"; env -0'],
        capture_output=True,
        check=True,
        env={"PATH": os.environ.get("PATH", "")},
    )
    return dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)


def test_a_port_held_by_a_stranger_fails_up_in_one_line(tmp_path: Path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PRIMUS_"))}
    env.update(PRIMUS_STACK_DIR=str(tmp_path / "state"), PRIMUS_STACK_PROMETHEUS_PORT=str(port))
    for name in ("AIRFLOW", "KAFKA", "KAFKA_CONTROLLER", "POSTGRES", "WORKER_LOG", "TRIGGER_LOG"):
        env[f"PRIMUS_STACK_{name}_PORT"] = str(free_port())
    try:
        done = _stack(env, "up", timeout=120)
    finally:
        taken.close()
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"127.0.0.1:{port} (Prometheus) is in use by something that is not this stack" in done.stderr
    assert _pids(tmp_path / "state") == {}  # nothing was started
