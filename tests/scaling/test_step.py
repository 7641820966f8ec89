"""primus_lib.scaling.step: a resize decision mirrored where the batch executors' tasks read it."""

from __future__ import annotations

from pathlib import Path

from primus_lib.allocation import role_resources
from primus_lib.scaling.base import Decision
from primus_lib.scaling.step import _share_resources
from primus_lib.spec import load_job

DEMO = Path(__file__).resolve().parents[2] / "config" / "jobs" / "ctr-demo.yaml"


def test_a_resize_that_leaves_memory_unchanged_keeps_the_memory_in_force(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path))
    job = load_job(DEMO, env={"PRIMUS_DATA": str(tmp_path / "data")})
    spec = job.spec.resources.roles["data_executor"]
    _share_resources(job, Decision("vertical", "resize", "data_executor", cpu=3.0, memory=2**30))
    _share_resources(job, Decision("vertical", "resize", "data_executor", cpu=1.5))  # memory None: unchanged
    assert role_resources(job, "data_executor") == (1.5, 2**30) != (spec.cpu, spec.memory)
