"""Helpers for the resource tests: a job spec with roles of our own, namespaces, the CRD."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from primus_lib.spec import PrimusJob, load_job

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "config" / "jobs" / "ctr-demo.yaml"


@pytest.fixture
def job_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PRIMUS_SUPERVISOR_POLL", "0.1")
    return tmp_path


def make_job(roles: dict, backend: str = "local", name: str = "ctr-demo", **resources) -> PrimusJob:
    """The demo job with other roles (our own small commands) and backend."""
    doc = load_job(DEMO).model_dump(mode="json", exclude_none=True)
    doc["metadata"]["name"] = name
    doc["spec"]["resources"] = {"backend": backend, "roles": roles, **resources}
    return PrimusJob.model_validate(doc)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def apply_crd(api_client) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    body = yaml.safe_load((ROOT / "config" / "crd" / "primusjob.yaml").read_text())
    ext = client.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            return
        time.sleep(0.1)
    raise AssertionError("the PrimusJob CRD never became Established")


def new_namespace(api_client, prefix: str = "t") -> str:
    from kubernetes import client

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": name}})
    return name
