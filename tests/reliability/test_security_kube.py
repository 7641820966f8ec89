"""The Kubernetes backend's objects as the real kube-apiserver stored them (tests/fixtures/kube.py):
every generated workload and pod runs as non-root without privilege escalation or capabilities,
on a read-only root filesystem, without an API token unless it needs one, and holds no secret;
the job's own ServiceAccount (``primus-workload``) is refused what it does not need, asked both as
a SubjectAccessReview and with its own token. The controller's ServiceAccount: tests/resources/test_rbac.py.
"""

from __future__ import annotations

import pytest
from kubernetes import client
from urllib3.exceptions import MaxRetryError

from primus_lib.resources.kubernetes import manifests as m
from primus_lib.resources.kubernetes.backend import KubernetesBackend
from primus_lib.resources.kubernetes.cluster import Cluster, api_client_for
from primus_lib.resources.kubernetes.names import (
    DATABASE_PASSWORD_ENV,
    JOB_LABEL,
    WORKLOAD_SERVICE_ACCOUNT,
    database_secret_name,
    spec_configmap_name,
)
from primus_lib.spec import PrimusJob
from tests.fixtures.kube import make_tls, write_kubeconfig
from tests.resources import conftest as resources
from tests.resources.conftest import wait_for
from tests.resources.test_kubernetes import k8s_job, started
from tests.resources.test_rbac import apply_rbac, as_controller, denied, service_account_token

job_env, kube_namespaces = resources.job_env, resources.kube_namespaces  # that package's fixtures, here too
PASSWORD = "ledger-pw-7c1e9a"  # the job's ledger password: in no object the API server keeps


def job_with_ledger() -> PrimusJob:
    return k8s_job(
        name="secure-job", storage={"database": f"postgresql+psycopg2://ledger:{PASSWORD}@ledger-db:5432/ledger"}
    )


def pod_specs(admin, ns: str, job: PrimusJob) -> dict[str, dict]:
    """name -> pod spec (as the API server returns it, camelCase) of every template and pod of the job."""
    selector = f"{JOB_LABEL}={job.name}"
    out: dict[str, dict] = {}
    for sts in client.AppsV1Api(admin).list_namespaced_stateful_set(ns, label_selector=selector).items:
        out[f"StatefulSet {sts.metadata.name}"] = admin.sanitize_for_serialization(sts.spec.template.spec)
    for job_obj in client.BatchV1Api(admin).list_namespaced_job(ns, label_selector=selector).items:
        out[f"Job {job_obj.metadata.name}"] = admin.sanitize_for_serialization(job_obj.spec.template.spec)
    for pod in client.CoreV1Api(admin).list_namespaced_pod(ns, label_selector=selector).items:
        out[f"Pod {pod.metadata.name}"] = admin.sanitize_for_serialization(pod.spec)
    return out


def security_problems(name: str, spec: dict, needs_token: bool) -> list[str]:
    problems = []
    pod_ctx = spec.get("securityContext") or {}
    if pod_ctx.get("runAsNonRoot") is not True or pod_ctx.get("runAsUser") in (None, 0):
        problems.append(f"{name}: pod securityContext {pod_ctx}")
    if pod_ctx.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append(f"{name}: no RuntimeDefault seccomp profile")
    if any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
        problems.append(f"{name}: shares a host namespace")
    if any("hostPath" in v for v in spec.get("volumes") or []):
        problems.append(f"{name}: hostPath volume")
    if spec.get("serviceAccountName") != WORKLOAD_SERVICE_ACCOUNT:
        problems.append(f"{name}: service account {spec.get('serviceAccountName')}")
    if bool(spec.get("automountServiceAccountToken")) != needs_token:
        problems.append(f"{name}: automountServiceAccountToken={spec.get('automountServiceAccountToken')}")
    token_volumes = [v["name"] for v in spec.get("volumes") or [] if v["name"].startswith("kube-api-access")]
    if token_volumes and not needs_token:
        problems.append(f"{name}: API token mounted ({token_volumes})")
    for container in spec["containers"] + (spec.get("initContainers") or []):
        ctx = container.get("securityContext") or {}
        where = f"{name}/{container['name']}"
        if ctx.get("allowPrivilegeEscalation") is not False or ctx.get("privileged"):
            problems.append(f"{where}: may escalate privileges ({ctx})")
        if ctx.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: writable root filesystem")
        if ctx.get("capabilities", {}).get("drop") != ["ALL"] or ctx.get("capabilities", {}).get("add"):
            problems.append(f"{where}: capabilities {ctx.get('capabilities')}")
        for var in container.get("env") or []:
            if PASSWORD in str(var.get("value", "")):
                problems.append(f"{where}: the ledger password in env {var['name']}")
    return problems


def test_every_generated_workload_and_pod_is_least_privileged_and_holds_no_secret(
    kube_cluster, job_env, kube_namespaces
):
    admin, ns, controller = as_controller(kube_cluster, kube_namespaces)
    job = job_with_ledger()
    backend = KubernetesBackend(job, cluster=Cluster(controller, ns))
    backend.submit()
    assert started(backend).phase == "Running"
    expected = {"StatefulSet": 1, "Job": 1, "Pod": 3}  # stream executors (2 pods) + the trainer (1 pod)
    specs = wait_for(
        "the job's workloads and pods",
        lambda: (
            (found := pod_specs(admin, ns, job))
            and all(sum(k.startswith(kind + " ") for k in found) >= n for kind, n in expected.items())
            and found
        ),
    )
    problems = []
    for name, spec in specs.items():
        trainer = "trainer" in name
        problems += security_problems(name, spec, needs_token=trainer)  # the trainer reads the executors' Endpoints
        refs = [
            v["valueFrom"]["secretKeyRef"]
            for c in spec["containers"]
            for v in c.get("env") or []
            if v["name"] == DATABASE_PASSWORD_ENV
        ]
        if refs != [{"name": database_secret_name(job), "key": "password"}]:
            problems.append(f"{name}: the ledger password is not a secretKeyRef: {refs}")
    assert not problems, "\n".join(problems)
    # The objects that carry the spec hold its database URL with the password as a variable.
    config = client.CoreV1Api(admin).read_namespaced_config_map(spec_configmap_name(job), ns)
    cr = client.CustomObjectsApi(admin).get_namespaced_custom_object(m.GROUP, m.VERSION, ns, m.PLURAL, job.name)
    for where, text in (("ConfigMap", str(config.data)), ("PrimusJob", str(cr))):
        assert PASSWORD not in text, f"the ledger password in the {where}"
        assert "ledger:${PRIMUS_DATABASE_PASSWORD}@ledger-db:5432/ledger" in text, where
    print(f"checked {len(specs)} stored templates and pods: {sorted(specs)}")


def access(admin, ns: str, verb: str, resource: str, namespace: str | None, group: str = "") -> bool:
    """A SubjectAccessReview for the job's ServiceAccount: the API server's own RBAC verdict."""
    user = f"system:serviceaccount:{ns}:{WORKLOAD_SERVICE_ACCOUNT}"
    attrs = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attrs["namespace"] = namespace
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
            "resourceAttributes": attrs,
        },
    }
    return client.AuthorizationV1Api(admin).create_subject_access_review(body).status.allowed


def test_the_jobs_own_service_account_is_refused_what_it_does_not_need(kube_cluster, kube_namespaces):
    admin = kube_cluster.client()
    ns, other = kube_namespaces(admin), kube_namespaces(admin)
    apply_rbac(admin, ns)
    client.CoreV1Api(admin).create_namespaced_secret(ns, {"metadata": {"name": "ledger"}, "stringData": {"p": "x"}})
    # what it needs: the stream executors' Endpoints in its own namespace
    assert access(admin, ns, "get", "endpoints", ns)
    refused = [
        ("list", "secrets", ns, ""),
        ("get", "secrets", ns, ""),
        ("list", "secrets", other, ""),
        ("create", "pods", ns, ""),
        ("create", "pods", other, ""),
        ("list", "pods", ns, ""),
        ("create", "pods/exec", ns, ""),
        ("get", "endpoints", other, ""),
        ("list", "endpoints", ns, ""),
        ("update", "configmaps", ns, ""),
        ("create", "statefulsets", ns, "apps"),
        ("patch", "primusjobs", ns, "primus.dev"),
        ("create", "rolebindings", ns, "rbac.authorization.k8s.io"),
        ("list", "nodes", None, ""),
        ("delete", "namespaces", None, ""),
    ]
    allowed = [r for r in refused if access(admin, ns, *r)]
    assert not allowed, f"{WORKLOAD_SERVICE_ACCOUNT} may {allowed}"
    # the same with its own token: the calls are refused (403), the one it needs answers
    workload = kube_cluster.client(service_account_token(admin, ns, WORKLOAD_SERVICE_ACCOUNT))
    core = client.CoreV1Api(workload)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    assert denied(lambda: core.list_namespaced_secret(ns))
    assert denied(lambda: core.read_namespaced_secret("ledger", ns))
    assert denied(lambda: core.create_namespaced_pod(other, pod))
    assert denied(lambda: core.create_namespaced_pod(ns, pod))
    assert denied(lambda: core.read_namespaced_endpoints("anything", other))
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as missing:
        core.read_namespaced_endpoints("no-such-service", ns)
    assert missing.value.status == 404  # allowed, and simply not there


def test_the_backend_verifies_the_api_servers_certificate(kube_apiserver, tmp_path):
    """A kubeconfig that trusts another CA cannot reach the API server: the client verifies TLS,
    as the test control plane's own kubeconfig (its CA, no insecure-skip-tls-verify) relies on."""
    (tmp_path / "other").mkdir()
    other_ca, _, _ = make_tls(tmp_path / "other")
    stranger = tmp_path / "kubeconfig"
    write_kubeconfig(stranger, "a", kube_apiserver.host, other_ca)
    with pytest.raises(MaxRetryError, match="CERTIFICATE_VERIFY_FAILED"):
        _ = Cluster(api_client_for(str(stranger), "a")).version
    assert Cluster(api_client_for(kube_apiserver.kubeconfig, "a")).version >= (1, 20)
