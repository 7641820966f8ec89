"""Helpers for the resource tests: their environment, commands of our own, namespaces, the CRD, and
waiting for what the Kubernetes controllers, scheduler and kwok do (tests/fixtures/kube.py). Their
jobs: the demo with roles of their own (tests/fixtures/specs.py, ``load(demo_doc(roles=...), check=False)``)."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def job_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    return tmp_path


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


def wait_for(what: str, check, timeout: float = 60.0, interval: float = 0.2):
    """Poll ``check()`` until it returns something truthy (and return that); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"not within {timeout:.0f}s: {what} (last: {last!r})")


def pods(api_client, namespace: str, selector: str = "") -> list:
    """The namespace's pods that are not being deleted."""
    from kubernetes import client

    items = client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in items if p.metadata.deletion_timestamp is None]


def running(api_client, namespace: str, selector: str = "", n: int | None = None) -> list:
    """The pods that a node runs (bound by the scheduler, Running by kwok); with ``n``, wait for exactly n."""

    def now():
        return [p for p in pods(api_client, namespace, selector) if p.status.phase == "Running" and p.spec.node_name]

    if n is None:
        return now()

    def exactly():
        found = now()
        return found if len(found) == n else None

    return wait_for(f"{n} running pods in {namespace} ({selector or 'all pods'})", exactly)


@pytest.fixture
def kube_namespaces():
    """new(api_client, prefix, name=None) -> a fresh namespace (``name``: that one), deleted after the
    test; teardown waits (up to 60 s) until its pods are gone, so the next test finds the nodes free."""
    from kubernetes import client

    made: list[tuple[object, str]] = []

    def new(api_client, prefix: str = "t", name: str | None = None) -> str:
        if name is None:
            name = new_namespace(api_client, prefix)
        else:
            client.CoreV1Api(api_client).create_namespace({"metadata": {"name": name}})
        made.append((api_client, name))
        return name

    yield new
    for api_client, name in made:
        core = client.CoreV1Api(api_client)
        core.delete_namespace(name)  # terminating: no controller can create pods there any more
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)  # no kubelet to wait for
    for api_client, name in made:
        core = client.CoreV1Api(api_client)
        gone = lambda core=core, name=name: not core.list_namespaced_pod(name).items  # noqa: E731
        wait_for(f"namespace {name}'s pods gone", gone, timeout=60)
