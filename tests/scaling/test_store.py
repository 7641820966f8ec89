"""primus_lib.scaling.store: what readers of the scaler's state get."""

from __future__ import annotations

import copy

from primus_lib.allocation import allocations_dir
from primus_lib.scaling.store import ScalingStore, role_replicas
from tests.fixtures.specs import AIRFLOW_ROLES, airflow_doc, load


def test_role_replicas_the_spec_until_the_horizontal_policy_decides(tmp_path):
    job = load(airflow_doc(), {"PRIMUS_DATA": str(tmp_path)}, storage=tmp_path / "jobs")
    assert role_replicas(job, "data_executor") == AIRFLOW_ROLES["data_executor"]["replicas"] == 2
    store = ScalingStore(allocations_dir(job) / "data_executor")
    store.save({"allocation": {"replicas": 5, "cpu": 1.0, "memory": 2**30}})
    assert role_replicas(job, "data_executor") == 5
    assert role_replicas(job, "stream_executor") == 1  # no such role: one worker


def test_role_replicas_is_at_least_one(tmp_path):
    doc = copy.deepcopy(airflow_doc())
    doc["spec"]["resources"]["roles"]["data_executor"]["replicas"] = 0
    job = load(doc, {"PRIMUS_DATA": str(tmp_path)}, storage=tmp_path / "jobs")
    assert role_replicas(job, "data_executor") == 1
