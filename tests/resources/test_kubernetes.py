"""The Kubernetes backend against a real kube-apiserver 1.20 (tests/fixtures/kube.py).

No controllers or kubelets run there: where a test patches an object's status, it plays the
StatefulSet/Job controller's part and says so (SIMULATION)."""

from __future__ import annotations

import pytest

from primus_lib.resources.base import ResourceError
from primus_lib.resources.kubernetes import manifests as m
from primus_lib.resources.kubernetes.backend import MERGE, KubernetesBackend
from primus_lib.resources.kubernetes.cluster import Cluster
from tests.resources.conftest import apply_crd, make_job, new_namespace

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


def k8s_job(name: str = "ctr-demo", trainer_replicas: int = 1):
    return make_job(
        {
            "data_executor": {"replicas": 2, "min_replicas": 1, "max_replicas": 8, "image": "primus:1"},
            "stream_executor": {"replicas": 2, "min_replicas": 1, "max_replicas": 4, "cpu": 1, "memory": "2Gi",
                                "image": "primus:1", "command": ["primus", "stream-executor", "{SPEC}"]},
            "trainer": {"replicas": trainer_replicas, "max_replicas": 4, "cpu": 2, "memory": "4Gi", "image": "primus:1",
                        "start_after": ["stream_executor"], "max_restarts": 2},
        },
        backend="kubernetes", name=name,
    )  # fmt: skip


@pytest.fixture
def admin(kube_apiserver):
    api = kube_apiserver.client()
    apply_crd(api)
    return api


@pytest.fixture
def backend(admin, job_env):
    ns = new_namespace(admin)
    return KubernetesBackend(k8s_job(), cluster=Cluster(admin, ns, "a"))


def simulate_statefulset_ready(backend: KubernetesBackend, role: str, ready: int) -> None:
    """SIMULATION: plays the StatefulSet controller + kubelets by writing readyReplicas."""
    name = m.workload_name(backend.job, role)
    body = {"status": {"replicas": ready, "readyReplicas": ready, "currentReplicas": ready}}
    backend.cluster.apps.patch_namespaced_stateful_set_status(name, backend.ns, body, **MERGE)


def test_crd_accepts_the_demo_job_and_rejects_a_bad_one(admin, job_env):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from primus_lib.spec import load_job
    from tests.resources.conftest import DEMO

    ns = new_namespace(admin)
    custom = client.CustomObjectsApi(admin)
    demo = load_job(DEMO)
    created = custom.create_namespaced_custom_object(m.GROUP, m.VERSION, ns, m.PLURAL, m.primusjob_object(demo, ns))
    assert created["spec"]["timer"]["window"] == "1h"
    assert created["spec"]["resources"]["roles"]["data_executor"]["max_replicas"] == 8
    status = {"status": {"phase": "Running"}}
    custom.patch_namespaced_custom_object_status(m.GROUP, m.VERSION, ns, m.PLURAL, "ctr-demo", status, **MERGE)
    assert (
        custom.get_namespaced_custom_object(m.GROUP, m.VERSION, ns, m.PLURAL, "ctr-demo")["status"]["phase"]
        == "Running"
    )
    bad = m.primusjob_object(demo, ns)
    bad["metadata"]["name"] = "bad"
    bad["spec"]["timer"]["window"] = "2h"
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(m.GROUP, m.VERSION, ns, m.PLURAL, bad)
    assert err.value.status == 422 and "window" in err.value.body


def test_submit_creates_objects_in_start_order_without_duplicates(backend):
    status = backend.submit()
    assert status.phase == "Pending"
    ns, c = backend.ns, backend.cluster
    sts = c.apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns)
    assert sts.spec.replicas == 2
    pod = sts.spec.template.spec
    assert pod.security_context.run_as_non_root and pod.security_context.run_as_user == m.RUN_AS
    container = pod.containers[0]
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    assert container.resources.requests == {"cpu": "1", "memory": "2Gi"}
    assert container.command == ["primus", "stream-executor", m.SPEC_FILE]
    assert pod.automount_service_account_token is False
    assert sts.metadata.owner_references[0].kind == "PrimusJob"
    assert "job.yaml" in c.core.read_namespaced_config_map("ctr-demo-spec", ns).data
    svc = c.core.read_namespaced_service("ctr-demo-trainer", ns)
    assert svc.spec.cluster_ip == "None"
    # the trainer starts after the stream executors: not yet
    assert c.batch.list_namespaced_job(ns).items == []
    assert (
        c.apps.list_namespaced_stateful_set(ns).items[0].metadata.name == "ctr-demo-stream-executor"
    )  # no data_executor

    simulate_statefulset_ready(backend, "stream_executor", 2)
    status = backend.ensure_running()
    jobs = c.batch.list_namespaced_job(ns).items
    assert [j.metadata.name for j in jobs] == ["ctr-demo-trainer"]
    trainer = jobs[0]
    assert trainer.spec.parallelism == 1 and trainer.spec.completions == 1
    assert trainer.spec.backoff_limit == 2
    assert trainer.spec.template.spec.subdomain == "ctr-demo-trainer"
    assert trainer.spec.template.spec.restart_policy == "Never"
    assert not backend.cluster.indexed_jobs  # 1.20: completionMode is not sent
    assert "completionMode" not in str(c.api.sanitize_for_serialization(trainer))
    assert status.phase == "Running"
    # idempotent: ensure_running again creates nothing new
    backend.ensure_running()
    assert len(c.batch.list_namespaced_job(ns).items) == 1
    assert len(c.apps.list_namespaced_stateful_set(ns).items) == 1
    cr = backend.get_cr()
    assert cr["status"]["phase"] == "Running"
    assert cr["status"]["roles"]["stream_executor"]["running"] == 2


def test_indexed_job_fields_for_newer_servers(job_env):
    job = k8s_job(trainer_replicas=4)
    body = m.trainer_job(job, indexed=True)
    assert body["spec"]["completionMode"] == "Indexed"
    assert "--node-rank=$(JOB_COMPLETION_INDEX)" in body["spec"]["template"]["spec"]["containers"][0]["command"]
    assert (
        "--master-addr=ctr-demo-trainer-0.ctr-demo-trainer"
        in body["spec"]["template"]["spec"]["containers"][0]["command"]
    )


def test_scale_and_resize_patch_the_workloads(backend):
    c, ns = backend.cluster, backend.ns
    backend.submit()
    simulate_statefulset_ready(backend, "stream_executor", 2)
    backend.reconcile()
    backend.scale("stream_executor", 3)
    assert c.apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns).spec.replicas == 3
    assert backend.get_cr()["spec"]["resources"]["roles"]["stream_executor"]["replicas"] == 3
    backend.scale("stream_executor", 99)  # clamped to max_replicas
    assert c.apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns).spec.replicas == 4

    before = c.apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns).metadata.generation
    backend.resize("stream_executor", cpu=2.5, memory=3 * 2**30)
    sts = c.apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns)
    assert sts.spec.template.spec.containers[0].resources.requests == {"cpu": "2500m", "memory": "3Gi"}
    assert sts.metadata.generation == before + 1  # a template change: the controller rolls the pods
    assert backend.role_status("stream_executor").cpu == 2.5

    old_uid = c.batch.read_namespaced_job("ctr-demo-trainer", ns).metadata.uid
    backend.resize("trainer", memory=6 * 2**30)
    trainer = c.batch.read_namespaced_job("ctr-demo-trainer", ns)
    assert trainer.metadata.uid != old_uid  # Job templates are immutable: recreated
    assert trainer.spec.template.spec.containers[0].resources.limits["memory"] == "6Gi"
    with pytest.raises(ResourceError, match="Indexed Jobs"):
        backend.scale("trainer", 2)


def test_failover_and_critical_failure_simulation(backend):
    c, ns = backend.cluster, backend.ns
    backend.submit()
    simulate_statefulset_ready(backend, "stream_executor", 2)
    backend.reconcile()
    # SIMULATION: the Job controller gave up after backoffLimit failed pods
    failed = {
        "status": {"failed": 3, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    }
    c.batch.patch_namespaced_job_status("ctr-demo-trainer", ns, failed, **MERGE)
    status = backend.ensure_running()
    assert status.phase == "Failed" and "trainer" in status.message
    backend.reconcile()
    assert c.apps.list_namespaced_stateful_set(ns).items == []  # other roles stopped
    assert backend.get_cr()["status"]["phase"] == "Failed"


def test_stream_executor_restarts_beyond_max_fail_the_role_simulation(admin, job_env):
    ns = new_namespace(admin)
    job = make_job({"data_executor": {"replicas": 1, "image": "i"},
                    "stream_executor": {"replicas": 1, "image": "i", "critical": True, "max_restarts": 1,
                                        "command": ["primus", "x"]},
                    "trainer": {"image": "i", "command": ["sleep", "1"]}}, backend="kubernetes")  # fmt: skip
    backend = KubernetesBackend(job, cluster=Cluster(admin, ns))
    backend.submit()
    # SIMULATION: the StatefulSet controller's pod, whose container the kubelet restarted twice
    pod = {"metadata": {"name": "ctr-demo-stream-executor-0", "labels": m.labels(job, "stream_executor")},
           "spec": {"containers": [{"name": "main", "image": "i"}]}}  # fmt: skip
    backend.cluster.core.create_namespaced_pod(ns, pod)
    cs = {"status": {"containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": False,
                                             "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}  # fmt: skip
    backend.cluster.core.patch_namespaced_pod_status("ctr-demo-stream-executor-0", ns, cs, **MERGE)
    status = backend.status()
    assert status.roles["stream_executor"].restarts == 2
    assert status.phase == "Failed" and "max_restarts" in status.message


def test_pytorchjob_when_the_kubeflow_crd_exists(kube_apiserver_b, job_env):
    from kubernetes import client

    api = kube_apiserver_b.client()
    apply_crd(api)
    ext = client.ApiextensionsV1Api(api)
    pytorch_crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "pytorchjobs.kubeflow.org"},
        "spec": {"group": "kubeflow.org", "scope": "Namespaced",
                 "names": {"plural": "pytorchjobs", "singular": "pytorchjob", "kind": "PyTorchJob"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]},
    }  # fmt: skip
    ext.create_custom_resource_definition(pytorch_crd)
    try:
        import time

        ns = new_namespace(api)
        cluster = Cluster(api, ns, "b")
        deadline = time.monotonic() + 20
        while not cluster.has_pytorchjob and time.monotonic() < deadline:
            del cluster.__dict__["has_pytorchjob"]
            time.sleep(0.2)
        job = make_job({"data_executor": {"replicas": 1, "image": "i"},
                        "trainer": {"replicas": 3, "max_replicas": 8, "image": "primus:1", "gpu": 8}}, backend="kubernetes")  # fmt: skip
        backend = KubernetesBackend(job, cluster=cluster)
        backend.submit()
        obj = backend.read_workload("trainer")
        assert obj["kind"] == "PyTorchJob"
        specs = obj["spec"]["pytorchReplicaSpecs"]
        assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
        assert specs["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
        backend.scale("trainer", 5)
        assert backend.read_workload("trainer")["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
        backend.resize("trainer", cpu=4)
        worker = backend.read_workload("trainer")["spec"]["pytorchReplicaSpecs"]["Worker"]
        assert worker["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "4"
        backend.stop()
        assert backend.read_workload("trainer") is None
        assert backend.get_cr()["status"]["phase"] == "Stopped"
    finally:
        ext.delete_custom_resource_definition("pytorchjobs.kubeflow.org")


def test_example_manifests_are_accepted_by_the_server(admin, job_env):
    """config/k8s/*.yaml (rendered for Kubernetes >= 1.22) pass the 1.20 server's validation (dry run)."""
    import yaml
    from kubernetes import client

    from tests.resources.conftest import ROOT

    ns = "primus"
    try:
        client.CoreV1Api(admin).create_namespace({"metadata": {"name": ns}})
    except Exception:
        pass
    creators = {
        "ConfigMap": client.CoreV1Api(admin).create_namespaced_config_map,
        "Service": client.CoreV1Api(admin).create_namespaced_service,
        "StatefulSet": client.AppsV1Api(admin).create_namespaced_stateful_set,
        "Job": client.BatchV1Api(admin).create_namespaced_job,
    }
    seen = []
    for path in sorted((ROOT / "config" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == "PrimusJob":
                client.CustomObjectsApi(admin).create_namespaced_custom_object(
                    m.GROUP, m.VERSION, ns, m.PLURAL, doc, dry_run="All"
                )
            else:
                creators[doc["kind"]](ns, doc, dry_run="All")
            seen.append(doc["kind"])
    assert sorted(seen) == ["ConfigMap", "ConfigMap", "Job", "PrimusJob", "Service", "StatefulSet"]
