"""primus_lib.allocation: the per-role CPU/memory in force (the scaler's decision, else the spec)."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_lib.allocation import read_allocations, record_allocation, role_resources, scaling_dir
from primus_lib.spec import load_job

DEMO = Path(__file__).resolve().parents[1] / "config" / "jobs" / "ctr-demo.yaml"


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path))
    return load_job(DEMO, env={"PRIMUS_DATA": str(tmp_path / "data")})


def test_the_spec_until_a_decision_then_the_decision(job):
    spec = job.spec.resources.roles["data_executor"]
    assert role_resources(job, "data_executor") == (spec.cpu, spec.memory)
    record_allocation(scaling_dir(job), "data_executor", 2.5, 3 * 2**30)
    record_allocation(scaling_dir(job), "stream_executor", 1.0, 2**30)
    assert role_resources(job, "data_executor") == (2.5, 3 * 2**30)
    assert set(read_allocations(scaling_dir(job))) == {"data_executor", "stream_executor"}


def test_a_broken_file_names_itself(job):
    scaling_dir(job).mkdir(parents=True)
    (scaling_dir(job) / "resources.json").write_text("{")
    with pytest.raises(ValueError, match="resources.json: not valid JSON"):
        role_resources(job, "data_executor")
