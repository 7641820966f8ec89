"""The Airflow scaler sensor: one poke = one scaling step; pool slots through a real Airflow API
server (/api/v2/pools), vertical decisions stored for executor_config, stream executors through
the local backend."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from primus_lib.airflow_api import AirflowApi, AirflowApiError
from primus_lib.metrics import ExecutorMetrics, TrainerMetrics
from primus_lib.resources.table import read_json, resources_dir
from tests.fake_http import FakeHTTP
from tests.fixtures.specs import demo_doc, load, write_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins"))

pytestmark = pytest.mark.integration


def test_pool_client_creates_then_patches_a_pool(airflow_api_server):
    client = AirflowApi(airflow_api_server.url, airflow_api_server.username, airflow_api_server.password)
    assert client.pool("primus-pool-test") is None
    assert client.set_pool_slots("primus-pool-test", 4)["slots"] == 4
    assert client.set_pool_slots("primus-pool-test", 7)["slots"] == 7
    assert client.pool("primus-pool-test")["slots"] == 7
    with pytest.raises(AirflowApiError, match="auth/token"):
        AirflowApi(airflow_api_server.url, "admin", "wrong").pool("x")


def test_pool_requests_are_what_airflow_documents():
    """Request construction, on a FAKE transport: PATCH with update_mask=slots, bearer token."""

    def answer(r):
        if r.path == "/auth/token":
            return 201, {"access_token": "t"}
        return 200, {"name": "primus-x", "slots": 3, "include_deferred": False}

    http = FakeHTTP(answer)
    AirflowApi("http://af:8080", "u", "p", session=http.session()).set_pool_slots("primus-x", 3)
    patch = http.requests[-1]
    assert patch.method == "PATCH" and patch.path == "/api/v2/pools/primus-x"
    assert patch.query == {"update_mask": ["slots"]}
    assert patch.body == {"pool": "primus-x", "slots": 3, "include_deferred": False}
    assert patch.headers["Authorization"] == "Bearer t"


def test_sensor_poke_applies_one_decision_per_role(airflow_api_server, job_env, monkeypatch):
    from primus_operators.sensors.scaler import PrimusScalerSensor

    roles = {
        "data_executor": {"replicas": 4, "min_replicas": 1, "max_replicas": 16, "cpu": 2, "memory": "4Gi"},
        "stream_executor": {"replicas": 2, "min_replicas": 1, "max_replicas": 6, "command": ["sleep", "1"]},
        "trainer": {"command": ["sleep", "1"]},
    }
    job = load(demo_doc(roles=roles, name="scaler-demo"), check=False)
    spec = write_spec(job_env / "job.yaml", job)
    conn = {
        "conn_type": "http",
        "host": "127.0.0.1",
        "port": int(airflow_api_server.url.rsplit(":", 1)[1]),
        "login": airflow_api_server.username,
        "password": airflow_api_server.password,
    }
    monkeypatch.setenv("AIRFLOW_CONN_PRIMUS_AIRFLOW_API", json.dumps(conn))
    # the embedded default: executors and the trainer report into the in-process registry
    for i in range(4):
        m = ExecutorMetrics("scaler-demo", worker=str(i), cpu_limit=2, memory_limit=4 * 2**30, registry=REGISTRY)
        m.observe_buffer(0, 100)
        m.observe_usage(1.9, 2**30)
    for i in range(2):
        s = ExecutorMetrics("scaler-demo", worker=f"s{i}", cpu_limit=1, memory_limit=2**31, role="stream_executor")
        s.observe_buffer(0, 100)
        s.observe_usage(0.95, 2**30)
        s.observe_lag(20_000)  # behind Kafka: more stream executors help
    TrainerMetrics("scaler-demo").observe_step(wait_seconds=0.4, total_seconds=1.0)

    sensor = PrimusScalerSensor(task_id="scale", spec_path=str(spec))
    result = sensor.poke({"data_interval_end": datetime(2026, 11, 1, tzinfo=UTC)})
    assert result.is_done  # the next window is long due: one step, then done
    decisions = {d["role"]: d for d in result.xcom_value}
    assert decisions["data_executor"]["action"] == "scale_up" and decisions["data_executor"]["replicas"] == 5
    pools = AirflowApi(airflow_api_server.url, airflow_api_server.username, airflow_api_server.password)
    assert pools.pool("primus-scaler-demo")["slots"] == 5
    assert decisions["stream_executor"]["replicas"] == 3
    desired = read_json(resources_dir(job) / "desired.json")
    assert desired["roles"]["stream_executor"]["replicas"] == 3  # the local backend's request
