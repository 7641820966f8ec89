"""Airflow tests run with their own AIRFLOW_HOME so nothing lands in ~/airflow."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="primus-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


@pytest.fixture
def failing_trainer_job(tmp_path, monkeypatch):
    """A local-backend job whose trainer exits 3 and is never restarted: (its spec path, its backend,
    not submitted yet). Whatever the test started is stopped after it."""
    from primus_lib.resources import backend_for
    from tests.fixtures.specs import demo_doc, load, write_spec
    from tests.resources.conftest import py

    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    roles = {"data_executor": {"replicas": 1}, "trainer": {"command": py("raise SystemExit(3)"), "max_restarts": 0}}
    job = load(demo_doc(roles=roles), check=False)
    spec = write_spec(tmp_path / "job.yaml", job)
    backend = backend_for(job, str(spec))
    try:
        yield str(spec), backend
    finally:
        backend.stop()
