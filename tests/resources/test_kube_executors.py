"""Stream executors on Kubernetes against the real control plane (tests/fixtures/kube.py): their
headless Service, the trainer's discovery through its Endpoints (filled by the real endpoints
controller from the pods kwok gives IPs and moves to Ready), and scaling that changes both the
StatefulSet's replicas and the N each executor picks its partitions by."""

from __future__ import annotations

import os
import stat
import subprocess

from kubernetes import client

from primus_lib.resources.discovery import discovery_for
from primus_lib.resources.kubernetes import manifests as m
from primus_lib.resources.kubernetes.backend import KubernetesBackend
from primus_lib.resources.kubernetes.cluster import Cluster
from primus_lib.resources.kubernetes.discovery import KubernetesDiscovery
from primus_lib.resources.kubernetes.names import FLIGHT_PORT, SPEC_FILE, executor_service_name, labels
from primus_lib.resources.kubernetes.pods import pod_template
from tests.fixtures.kube import simulate_restarts
from tests.fixtures.specs import demo_doc, load
from tests.resources.conftest import apply_crd, running, wait_for
from tests.resources.test_kubernetes import selector
from tests.resources.test_rbac import apply_rbac, denied, service_account_token


def executor_job(name: str = "ctr-demo"):
    """Stream executors running their default command (``primus executor``), not a test's own."""
    roles = {
        "data_executor": {"replicas": 1, "image": "primus:1"},
        "stream_executor": {
            "replicas": 2,
            "min_replicas": 1,
            "max_replicas": 4,
            "cpu": 1,
            "memory": "1Gi",
            "image": "primus:1",
        },
        "trainer": {"replicas": 1, "cpu": 2, "memory": "4Gi", "image": "primus:1", "start_after": ["stream_executor"]},
    }
    return load(demo_doc(roles=roles, backend="kubernetes", name=name), check=False)


def env_of(container) -> dict[str, str | None]:
    return {e.name: e.value for e in container.env or []}


def test_executor_pod_command_computes_its_index_and_n(tmp_path, job_env):
    """The container's shell turns the pod name into --index; N, bind and advertise as given."""
    job = executor_job()
    sts = m.statefulset(job, "stream_executor", replicas=3)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert sts["spec"]["serviceName"] == executor_service_name(job) == "ctr-demo-stream-executor"
    assert container["ports"] == [{"name": "flight", "containerPort": FLIGHT_PORT}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "flight"}
    env = {e["name"]: e for e in container["env"]}
    assert env["PRIMUS_REPLICAS"]["value"] == "3"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    fake = tmp_path / "primus"  # stands in for the image's `primus`: prints its arguments
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    pod_env = {
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "POD_NAME": "ctr-demo-stream-executor-12",
        "POD_IP": "10.1.2.3",
        "PRIMUS_REPLICAS": "3",
    }
    out = subprocess.run(container["command"], env=pod_env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [
        "executor",
        SPEC_FILE,
        "--index",
        "12",
        "--replicas",
        "3",
        "--host",
        "0.0.0.0",
        "--port",
        str(FLIGHT_PORT),
        "--advertise",
        "10.1.2.3",
    ]
    service = m.executor_service(job)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is False
    assert service["spec"]["selector"] == labels(job, "stream_executor")
    # only the trainer gets a token (to read the Endpoints); executors and others get none
    assert pod_template(job, "trainer", "Never", cmd=[])["spec"]["automountServiceAccountToken"] is True
    assert sts["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_discovery_lists_ready_executors_and_follows_scale(kube_cluster, job_env, kube_namespaces, monkeypatch):
    admin = kube_cluster.client()
    apply_crd(admin)
    ns = kube_namespaces(admin)
    job = executor_job()
    backend = KubernetesBackend(job, cluster=Cluster(admin, ns, "a"))
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    backend.submit()
    svc = core.read_namespaced_service(executor_service_name(job), ns)
    assert svc.spec.cluster_ip == "None" and [(p.name, p.port) for p in svc.spec.ports] == [("flight", FLIGHT_PORT)]
    sts = apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns)
    assert sts.spec.service_name == svc.metadata.name
    assert sts.spec.template.spec.containers[0].command[:2] == ["/bin/sh", "-c"]
    assert env_of(sts.spec.template.spec.containers[0])["PRIMUS_REPLICAS"] == "2"

    monkeypatch.delenv("PRIMUS_STREAM_EXECUTORS", raising=False)
    monkeypatch.setenv("PRIMUS_KUBE_NAMESPACE", ns)
    found = discovery_for(job, "realtime")
    assert isinstance(found, KubernetesDiscovery) and (found.service, found.namespace) == (svc.metadata.name, ns)
    discovery = KubernetesDiscovery(svc.metadata.name, ns, api_client=admin)
    executors = selector(job, "stream_executor")

    def located(n: int):
        def check():
            pods = {p.metadata.name: p for p in running(admin, ns, executors) if p.metadata.deletion_timestamp is None}
            if len(pods) != n or any(env_of(p.spec.containers[0])["PRIMUS_REPLICAS"] != str(n) for p in pods.values()):
                return None  # still rolling
            want = {int(name.rsplit("-", 1)[1]): f"grpc://{p.status.pod_ip}:{FLIGHT_PORT}" for name, p in pods.items()}
            return want if discovery.locations() == want else None

        return wait_for(f"{n} executors (N={n}) in the Endpoints", check, timeout=90, interval=0.3)

    two = located(2)
    assert sorted(two) == [0, 1] and all(loc.startswith("grpc://10.") for loc in two.values())

    # the scaler changes their number: replicas and every executor's N (the pods roll)
    backend.scale("stream_executor", 3)
    sts = apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns)
    assert sts.spec.replicas == 3 and env_of(sts.spec.template.spec.containers[0])["PRIMUS_REPLICAS"] == "3"
    assert sorted(located(3)) == [0, 1, 2]
    assert backend.get_cr()["spec"]["resources"]["roles"]["stream_executor"]["replicas"] == 3
    backend.scale("stream_executor", 2)
    assert sorted(located(2)) == [0, 1]

    # a pod that is not Ready leaves the Endpoints' ready addresses: discovery drops it
    simulate_restarts(admin, ns, "ctr-demo-stream-executor-1", 1)  # SIMULATION: its container crashed
    wait_for("executor 1 out of discovery", lambda: sorted(discovery.locations()) == [0], timeout=60)

    # the trainer's identity (config/rbac: primus-workload) may get the Endpoints, nothing more
    apply_rbac(admin, ns)
    workload = kube_cluster.client(service_account_token(admin, ns, "primus-workload"))
    assert sorted(KubernetesDiscovery(svc.metadata.name, ns, api_client=workload).locations()) == [0]
    assert denied(lambda: client.CoreV1Api(workload).list_namespaced_endpoints(ns))
    assert denied(lambda: client.CoreV1Api(workload).list_namespaced_pod(ns))

    # vertical (item 4): resize changes the template's requests and limits; N stays
    backend.resize("stream_executor", cpu=2, memory=3 * 2**30)
    container = apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns).spec.template.spec.containers[0]
    assert container.resources.requests == container.resources.limits == {"cpu": "2", "memory": "3Gi"}
    assert env_of(container)["PRIMUS_REPLICAS"] == "2"

    backend.stop()
    wait_for("the Service and its Endpoints gone", lambda: discovery.locations() == {}, timeout=60)
