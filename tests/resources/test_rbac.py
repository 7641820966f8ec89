"""config/rbac/ against a real control plane: a token of the controller's ServiceAccount (TokenRequest
API) runs a job - the controllers, scheduler and kwok bring its pods up - measures the cluster's
idleness from its nodes and pods, and is denied what it must not do."""

from __future__ import annotations

import uuid

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from primus_lib.resources.kubernetes.backend import KubernetesBackend
from primus_lib.resources.kubernetes.capacity import capacity
from primus_lib.resources.kubernetes.cluster import Cluster
from tests.resources.conftest import ROOT, apply_crd
from tests.resources.test_kubernetes import k8s_job, started


def apply_rbac(api, namespace: str) -> None:
    """Apply config/rbac/*.yaml with the namespace (and the cluster-wide names) made unique."""
    rbac, core = client.RbacAuthorizationV1Api(api), client.CoreV1Api(api)
    suffix = uuid.uuid4().hex[:6]
    for path in sorted((ROOT / "config" / "rbac").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            doc["metadata"].pop("namespace", None)
            for subject in doc.get("subjects", []):
                subject["namespace"] = namespace
            kind = doc["kind"]
            if kind == "ServiceAccount":
                core.create_namespaced_service_account(namespace, doc)
            elif kind == "Role":
                rbac.create_namespaced_role(namespace, doc)
            elif kind == "RoleBinding":
                rbac.create_namespaced_role_binding(namespace, doc)
            elif kind == "ClusterRole":
                doc["metadata"]["name"] += f"-{suffix}"
                rbac.create_cluster_role(doc)
            elif kind == "ClusterRoleBinding":
                doc["metadata"]["name"] += f"-{suffix}"
                doc["roleRef"]["name"] += f"-{suffix}"
                rbac.create_cluster_role_binding(doc)
            else:
                raise AssertionError(f"{path}: unexpected kind {kind}")


def service_account_token(api, namespace: str, name: str = "primus-controller") -> str:
    body = {"spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600}}
    return client.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, body).status.token


def as_controller(kube_cluster, kube_namespaces):
    """(admin client, a fresh namespace with the CRD and config/rbac applied, a client that is the
    controller's ServiceAccount there): how a test runs the backend as the controller would."""
    admin = kube_cluster.client()
    apply_crd(admin)
    ns = kube_namespaces(admin)
    apply_rbac(admin, ns)
    return admin, ns, kube_cluster.client(service_account_token(admin, ns))


def denied(call) -> bool:
    try:
        call()
    except ApiException as exc:
        return exc.status == 403
    return False


def test_controller_service_account_can_run_a_job_and_nothing_more(kube_cluster, job_env, kube_namespaces):
    admin = kube_cluster.client()
    apply_crd(admin)
    ns, other = kube_namespaces(admin), kube_namespaces(admin)
    apply_rbac(admin, ns)
    token = service_account_token(admin, ns)
    api = kube_cluster.client(token)

    backend = KubernetesBackend(k8s_job(), cluster=Cluster(api, ns))
    backend.submit()
    assert started(backend).phase == "Running"  # waited for the pods, created the trainer Job, wrote the CR status
    backend.scale("stream_executor", 3)
    backend.resize("stream_executor", cpu=2)
    # cluster-wide reads for idleness (cluster-role.yaml): the nodes and every namespace's pods
    assert {n.metadata.name for n in client.CoreV1Api(api).list_node().items} == {n.name for n in kube_cluster.nodes}
    cap = capacity(Cluster(api, ns))
    assert cap.cpu_total == 32 and cap.source == "2 of 2 nodes schedulable; pods of all namespaces"
    assert cap.cpu_requested >= 2 + 3 * 1  # the trainer and (at least) the executors as they roll to 2 cores

    core, apps, rbac = client.CoreV1Api(api), client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    assert denied(lambda: core.list_namespaced_secret(ns))
    assert denied(lambda: core.create_namespaced_pod(ns, pod))
    assert denied(lambda: core.connect_post_namespaced_pod_exec("p", ns, command="sh"))
    assert denied(lambda: apps.create_namespaced_stateful_set(other, backend.workload("stream_executor", None)))
    assert denied(lambda: core.delete_namespace(other))
    assert denied(lambda: core.patch_node(kube_cluster.nodes[0].name, {"metadata": {"labels": {"x": "y"}}}))
    assert denied(lambda: core.patch_namespaced_pod_status("ctr-demo-stream-executor-0", ns, {"status": {}}))
    binding = {
        "metadata": {"name": "escalate"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "primus-controller", "namespace": ns}],
    }
    assert denied(lambda: rbac.create_namespaced_role_binding(ns, binding))
    # the workload identity may only read endpoints (stream executor discovery): nothing else
    workload = kube_cluster.client(service_account_token(admin, ns, "primus-workload"))
    assert denied(lambda: client.CoreV1Api(workload).list_namespaced_pod(ns))
