"""Placement over two real kube-apiservers (different ports, kubeconfig contexts): each role goes to
the idlest cluster that fits; a cluster that gets busy gets resources back.

No nodes exist there, so capacity comes from the primus-capacity ConfigMap (docs/resources.md);
"other tenants" are Pending pods with requests (no scheduler binds them)."""

from __future__ import annotations

import pytest
from kubernetes import client

from primus_lib.resources import backend_for
from primus_lib.resources.base import ResourceError
from primus_lib.resources.kubernetes.capacity import CAPACITY_CONFIGMAP, capacity
from primus_lib.resources.multicluster import MultiClusterBackend
from tests.resources.conftest import apply_crd, make_job, new_namespace

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


def set_capacity(api, ns: str, cpu: str, memory: str) -> None:
    client.CoreV1Api(api).create_namespaced_config_map(ns, {"metadata": {"name": CAPACITY_CONFIGMAP},
                                                            "data": {"cpu": cpu, "memory": memory}})  # fmt: skip


def tenant_pod(api, ns: str, name: str, cpu: str, memory: str = "1Gi") -> None:
    body = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "other:1",
            "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}  # fmt: skip
    client.CoreV1Api(api).create_namespaced_pod(ns, body)


def test_roles_go_to_the_idlest_cluster_that_fits_and_busy_clusters_get_resources_back(
    kube_apiserver, kube_apiserver_b, job_env
):
    a, b = kube_apiserver.client(), kube_apiserver_b.client()
    for api in (a, b):
        apply_crd(api)
    ns = new_namespace(a, "mc")
    client.CoreV1Api(b).create_namespace({"metadata": {"name": ns}})
    set_capacity(a, ns, "32", "128Gi")
    set_capacity(b, ns, "16", "64Gi")
    tenant_pod(a, ns, "tenant-1", "8")  # a: 24 of 32 cores free (75%), b: 16 of 16 (100%)
    clusters = [
        {"name": "a", "backend": "kubernetes", "kubeconfig": kube_apiserver.kubeconfig, "context": "a", "namespace": ns},
        {"name": "b", "backend": "kubernetes", "kubeconfig": kube_apiserver_b.kubeconfig, "context": "b", "namespace": ns},
    ]  # fmt: skip
    roles = {
        "data_executor": {"replicas": 1, "image": "i"},
        "stream_executor": {"replicas": 4, "min_replicas": 1, "max_replicas": 4, "cpu": 2, "memory": "4Gi",
                            "image": "primus:1", "command": ["primus", "stream", "{SPEC}"]},
        "trainer": {"replicas": 1, "cpu": 8, "memory": "16Gi", "image": "primus:1"},
    }  # fmt: skip
    job = make_job(roles, backend="kubernetes", clusters=clusters)
    backend = backend_for(job)
    assert isinstance(backend, MultiClusterBackend)
    backend.submit()
    # stream executors (8 cores) -> b (idlest, 100%); then b is 50% free, a 75% -> the trainer goes to a
    assert backend.placement() == {"stream_executor": "b", "trainer": "a"}
    assert client.AppsV1Api(b).read_namespaced_stateful_set("ctr-demo-stream-executor", ns).spec.replicas == 4
    assert client.BatchV1Api(a).read_namespaced_job("ctr-demo-trainer", ns).spec.parallelism == 1
    assert client.AppsV1Api(a).list_namespaced_stateful_set(ns).items == []
    cap_b = capacity(backend.members["b"].cluster)
    assert cap_b.source == f"configmap/{CAPACITY_CONFIGMAP}" and cap_b.cpu_requested == 8

    # another process reattaches to the same placement
    again = backend_for(job)
    assert again.placement() == backend.placement()
    assert again.status().roles["stream_executor"].cluster == "b"

    # b gets busy: another tenant asks for 7 of its 16 cores -> only 1 core free (6%)
    tenant_pod(b, ns, "tenant-2", "7")
    changes = again.rebalance()
    assert changes == [
        {"cluster": "b", "role": "stream_executor", "from": 4, "to": 3, "idleness": pytest.approx(1 / 16)}
    ]
    assert client.AppsV1Api(b).read_namespaced_stateful_set("ctr-demo-stream-executor", ns).spec.replicas == 3
    assert again.rebalance() == []  # 3 of 16 cores free (19%): not busy any more

    # a role that fits nowhere is refused with the numbers
    big = make_job(
        {**roles, "trainer": {**roles["trainer"], "cpu": 64}}, backend="kubernetes", name="big", clusters=clusters
    )
    with pytest.raises(ResourceError, match="needs 64 cores"):
        MultiClusterBackend(big).place("trainer")
