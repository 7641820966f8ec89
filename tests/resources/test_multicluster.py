"""Placement over two real Kubernetes clusters (tests/fixtures/kube.py): "a" with 2 nodes of 16 cores /
64 GiB, "b" with 2 nodes of 8 cores / 32 GiB (kwok). Idleness is read from those nodes and the pods
the scheduler bound to them, in every namespace (primus_lib/resources/kubernetes/capacity.py).
"Other tenants" are Deployments of other namespaces whose pods the controllers create and the
scheduler binds. Each role goes to the idlest cluster that fits it; a busy cluster gets resources back."""

from __future__ import annotations

import pytest
from kubernetes import client

from primus_lib.resources import backend_for
from primus_lib.resources.base import ResourceError
from primus_lib.resources.kubernetes.capacity import Capacity, NodeRoom, capacity
from primus_lib.resources.kubernetes.cluster import Cluster
from primus_lib.resources.multicluster import MultiClusterBackend
from tests.fixtures.specs import demo_doc, load
from tests.resources.conftest import apply_crd, running, wait_for

GiB = 2**30


def tenant(api, ns: str, replicas: int, cpu: str = "1", memory: str = "1Gi") -> None:
    """Another tenant's workload (not Primus's): a Deployment whose pods the scheduler binds."""
    labels = {"app": "tenant"}
    body = {
        "metadata": {"name": "tenant"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {"name": "c", "image": "other:1", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
                    ]
                },
            },
        },
    }
    client.AppsV1Api(api).create_namespaced_deployment(ns, body)
    running(api, ns, "app=tenant", n=replicas)


def wait_empty(api, name: str) -> None:
    """Earlier tests' pods are gone from the cluster's nodes (their namespaces were deleted)."""
    cluster = Cluster(api, "default", name)
    wait_for(f"cluster {name}'s nodes free of earlier pods", lambda: capacity(cluster).cpu_requested < 0.01)


def test_fits_counts_pods_per_node_not_the_cluster_total():
    nodes = (NodeRoom("n0", 16, 64 * GiB, 110, cpu_used=4), NodeRoom("n1", 16, 64 * GiB, 110, cpu_used=12))
    cap = Capacity(32, 128 * GiB, 16, 0, "test", nodes)
    assert cap.free_cpu == 16 and cap.idleness == pytest.approx(0.5)
    assert cap.fits(12, GiB) and not cap.fits(13, GiB)  # 16 cores free, but at most 12 on one node
    assert cap.fits(4, GiB, replicas=4) and not cap.fits(4, GiB, replicas=5)
    assert not cap.fits(1, 65 * GiB)


def test_roles_go_to_the_idlest_cluster_that_fits_and_busy_clusters_get_resources_back(
    kube_apiserver, kube_apiserver_b, job_env, kube_namespaces
):
    a, b = kube_apiserver.client(), kube_apiserver_b.client()
    for api, name in ((a, "a"), (b, "b")):
        apply_crd(api)
        wait_empty(api, name)
    ns = kube_namespaces(a, "mc")
    kube_namespaces(b, name=ns)
    tenants_a, tenants_b = kube_namespaces(a, "tenants"), kube_namespaces(b, "tenants")
    tenant(a, tenants_a, 8)  # a: 24 of 32 cores free (75%), b: 16 of 16 (100%)
    clusters = [
        {
            "name": "a",
            "backend": "kubernetes",
            "kubeconfig": kube_apiserver.kubeconfig,
            "context": "a",
            "namespace": ns,
        },
        {
            "name": "b",
            "backend": "kubernetes",
            "kubeconfig": kube_apiserver_b.kubeconfig,
            "context": "b",
            "namespace": ns,
        },
    ]
    roles = {
        "data_executor": {"replicas": 1, "image": "i"},
        "stream_executor": {
            "replicas": 4,
            "min_replicas": 1,
            "max_replicas": 4,
            "cpu": 2,
            "memory": "4Gi",
            "image": "primus:1",
            "command": ["primus", "stream", "{SPEC}"],
        },
        "trainer": {"replicas": 1, "cpu": 8, "memory": "16Gi", "image": "primus:1"},
    }
    job = load(demo_doc(roles=roles, backend="kubernetes", resources={"clusters": clusters}), check=False)
    backend = backend_for(job)
    assert isinstance(backend, MultiClusterBackend)
    backend.submit()
    # stream executors (8 cores) -> b (idlest, 100%); their pods, not bound yet, count on paper: b is then
    # 50% free, a 75% -> the trainer goes to a
    assert backend.placement() == {"stream_executor": "b", "trainer": "a"}
    assert client.AppsV1Api(b).read_namespaced_stateful_set("ctr-demo-stream-executor", ns).spec.replicas == 4
    assert client.BatchV1Api(a).read_namespaced_job("ctr-demo-trainer", ns).spec.parallelism == 1
    assert client.AppsV1Api(a).list_namespaced_stateful_set(ns).items == []
    on_b = running(b, ns, "primus.dev/role=stream-executor", n=4)
    assert {p.spec.node_name for p in on_b} <= {n.name for n in kube_apiserver_b.nodes}
    running(a, ns, "primus.dev/role=trainer", n=1)
    cap_b = capacity(backend.members["b"].cluster)
    assert cap_b.cpu_total == 16 and cap_b.cpu_requested == 8 and cap_b.idleness == pytest.approx(0.5)
    assert cap_b.source.startswith("2 of 2 nodes schedulable")
    cap_a = capacity(backend.members["a"].cluster)
    assert cap_a.cpu_requested == 16 and cap_a.memory_requested == 8 * GiB + 16 * GiB  # tenants + trainer

    # another process reattaches to the same placement
    again = backend_for(job)
    assert again.placement() == backend.placement()
    assert again.status().roles["stream_executor"].cluster == "b"
    assert again.status().phase == "Running"

    # b gets busy: another tenant's 7 pods of 1 core -> only 1 of its 16 cores free (6%)
    tenant(b, tenants_b, 7)
    changes = again.rebalance()
    assert changes == [
        {"cluster": "b", "role": "stream_executor", "from": 4, "to": 3, "idleness": pytest.approx(1 / 16)}
    ]
    assert client.AppsV1Api(b).read_namespaced_stateful_set("ctr-demo-stream-executor", ns).spec.replicas == 3
    running(b, ns, "primus.dev/role=stream-executor", n=3)  # the StatefulSet controller removed one pod
    # the removed pod holds its core until kwok has finished deleting it (as a kubelet would): wait for that
    wait_for("b's removed pod to free its core", lambda: capacity(backend.members["b"].cluster).free_cpu == 3)
    assert again.rebalance() == []  # 3 of 16 cores free (19%): not busy any more

    # a role that fits nowhere is refused with the numbers
    fat = {**roles, "trainer": {**roles["trainer"], "cpu": 17}}
    big = load(demo_doc(roles=fat, backend="kubernetes", name="big", resources={"clusters": clusters}), check=False)
    with pytest.raises(ResourceError, match=r"needs 1 x 17 cores") as err:
        MultiClusterBackend(big).place("trainer")
    assert "at most" in str(err.value)
