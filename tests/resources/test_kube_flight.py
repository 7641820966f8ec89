"""The stream executors' Flight service on Kubernetes, against the real control plane
(tests/fixtures/kube.py): the controller (its ServiceAccount, config/rbac) creates the job's Flight
token as a Secret it cannot read back, mounts it into the executor and trainer pods (where
``KubernetesDiscovery`` reads it), and a NetworkPolicy the API server accepts that admits to the
executor pods only the job's trainer pods, on the Flight port. Nothing here runs a container (kwok):
the token's use is tested against real executor processes in tests/data/test_flight_auth.py."""

from __future__ import annotations

import base64
from pathlib import Path

from kubernetes import client

from primus_lib.resources.kubernetes.backend import KubernetesBackend
from primus_lib.resources.kubernetes.cluster import Cluster
from primus_lib.resources.kubernetes.discovery import KubernetesDiscovery
from primus_lib.resources.kubernetes.names import (
    FLIGHT_PORT,
    FLIGHT_SECRET_MOUNT,
    FLIGHT_TOKEN_FILE,
    FLIGHT_TOKEN_KEY,
    executor_service_name,
    flight_secret_name,
    trainer_service_name,
)
from primus_lib.resources.kubernetes.pods import pod_template
from tests.resources.conftest import wait_for
from tests.resources.test_kube_executors import executor_job
from tests.resources.test_kubernetes import selector, started
from tests.resources.test_rbac import as_controller, denied


def flight_mounts(spec) -> list[tuple[str, str]]:
    """(secret, mount path) of every Secret volume mounted into the pod spec's containers."""
    secrets = {v.name: v.secret.secret_name for v in spec.volumes or [] if v.secret is not None}
    mounts = [mount for container in spec.containers for mount in container.volume_mounts or []]
    return [(secrets[mount.name], mount.mount_path) for mount in mounts if mount.name in secrets]


def test_the_token_is_mounted_where_the_pods_discovery_reads_it(job_env):
    job = executor_job()
    assert KubernetesDiscovery.for_job(job, "realtime").token.where == Path(FLIGHT_TOKEN_FILE)
    assert KubernetesDiscovery.for_job(job, "realtime").token.create is False  # a pod never makes one
    for role in ("stream_executor", "trainer"):
        pod = pod_template(job, role, "Always", cmd=["x"])["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "flight-token")
        assert volume["secret"] == {"secretName": "ctr-demo-flight", "defaultMode": 0o440}
        mount = next(v for v in pod["containers"][0]["volumeMounts"] if v["name"] == "flight-token")
        assert mount == {"name": "flight-token", "mountPath": FLIGHT_SECRET_MOUNT, "readOnly": True}
    others = pod_template(job, "data_executor", "Always", cmd=["x"])["spec"]
    assert "flight-token" not in [v["name"] for v in others["volumes"]]  # no other role gets the token


def test_the_controller_creates_the_token_and_a_network_policy_that_admits_only_the_trainer(
    kube_cluster, job_env, kube_namespaces
):
    admin, ns, controller = as_controller(kube_cluster, kube_namespaces)
    job = executor_job()
    backend = KubernetesBackend(job, cluster=Cluster(controller, ns))
    backend.submit()
    started(backend)
    core, networking = client.CoreV1Api(admin), client.NetworkingV1Api(admin)

    secret = core.read_namespaced_secret(flight_secret_name(job), ns)
    token = base64.b64decode(secret.data[FLIGHT_TOKEN_KEY]).decode()
    assert len(token) >= 32 and secret.metadata.owner_references[0].kind == "PrimusJob"
    assert denied(lambda: client.CoreV1Api(controller).read_namespaced_secret(flight_secret_name(job), ns))
    backend.reconcile()  # the controller comes back: the Secret (and the pods' token) stays as it was
    assert core.read_namespaced_secret(flight_secret_name(job), ns).data == secret.data

    # every executor and trainer pod, as the API server stored them, mounts the job's token
    def pods_of(role: str) -> list:
        return core.list_namespaced_pod(ns, label_selector=selector(job, role)).items

    executors = wait_for("2 executor pods", lambda: len(found := pods_of("stream_executor")) == 2 and found)
    trainers = pods_of("trainer")
    assert len(trainers) == 1
    for pod in [*executors, *trainers]:
        assert (flight_secret_name(job), FLIGHT_SECRET_MOUNT) in flight_mounts(pod.spec), pod.metadata.name

    # the NetworkPolicy as stored: the executor pods, ingress only from the trainer pods on the Flight port
    policy = networking.read_namespaced_network_policy(executor_service_name(job), ns)
    assert policy.spec.policy_types == ["Ingress"] and len(policy.spec.ingress) == 1
    rule = policy.spec.ingress[0]
    assert [(p.protocol, p.port) for p in rule.ports] == [("TCP", FLIGHT_PORT)]
    assert len(rule._from) == 1 and rule._from[0].namespace_selector is None and rule._from[0].ip_block is None

    def chosen(labels: dict[str, str]) -> set[str]:  # the pods a selector picks, as the API server matches it
        found = core.list_namespaced_pod(ns, label_selector=",".join(f"{k}={v}" for k, v in labels.items()))
        return {p.metadata.name for p in found.items}

    assert chosen(policy.spec.pod_selector.match_labels) == {p.metadata.name for p in executors}
    assert chosen(rule._from[0].pod_selector.match_labels) == {p.metadata.name for p in trainers}
    # the trainers' policy: their rendezvous store and collectives ask no login, so only the job's own
    # trainer pods reach them (any port: gloo and NCCL choose theirs)
    ranks = networking.read_namespaced_network_policy(trainer_service_name(job), ns)
    assert ranks.spec.policy_types == ["Ingress"] and len(ranks.spec.ingress) == 1
    (only,) = ranks.spec.ingress
    assert only.ports is None and len(only._from) == 1 and only._from[0].namespace_selector is None
    assert chosen(ranks.spec.pod_selector.match_labels) == {p.metadata.name for p in trainers}
    assert chosen(only._from[0].pod_selector.match_labels) == {p.metadata.name for p in trainers}

    backend.stop()
    remaining = networking.list_namespaced_network_policy(ns).items
    assert [p.metadata.name for p in remaining] == []
