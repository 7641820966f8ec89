"""The Kubernetes backend against a real control plane: kube-apiserver, kube-controller-manager and
kube-scheduler 1.20, and kwok playing the kubelets of fake nodes with 16 cores / 64 GiB each
(tests/fixtures/kube.py).

The StatefulSet and Job controllers create the pods, the scheduler binds them to nodes (or leaves
them Pending), kwok runs them. No test writes a pod's or workload's status. The one simulated part
is a container's process: a test that needs a worker to exit or crash annotates its pod
(SIMULATION: simulate_exit / simulate_restarts) and kwok reports it as a kubelet would."""

from __future__ import annotations

import pytest

from primus_lib.resources.base import ResourceError
from primus_lib.resources.kubernetes import manifests as m
from primus_lib.resources.kubernetes.backend import MERGE, KubernetesBackend
from primus_lib.resources.kubernetes.cluster import Cluster
from primus_lib.resources.kubernetes.names import RUN_AS, SPEC_FILE, labels
from tests.fixtures.kube import simulate_exit, simulate_restarts
from tests.fixtures.specs import demo_doc, load
from tests.resources.conftest import apply_crd, new_namespace, pods, running, wait_for


def k8s_job(name: str = "ctr-demo", trainer_replicas: int = 1, max_restarts: int = 2, stream_cpu=1, **fields):
    """The demo job on Kubernetes with stream executors the trainer starts after; ``fields``: more of its spec."""
    roles = {
        "data_executor": {"replicas": 2, "min_replicas": 1, "max_replicas": 8, "image": "primus:1"},
        "stream_executor": {
            "replicas": 2,
            "min_replicas": 1,
            "max_replicas": 4,
            "cpu": stream_cpu,
            "memory": "2Gi",
            "image": "primus:1",
            "command": ["primus", "stream-executor", "{SPEC}"],
        },
        "trainer": {
            "replicas": trainer_replicas,
            "max_replicas": 4,
            "cpu": 2,
            "memory": "4Gi",
            "image": "primus:1",
            "start_after": ["stream_executor"],
            "max_restarts": max_restarts,
        },
    }
    return load(demo_doc(roles=roles, backend="kubernetes", name=name, **fields), check=False)


def selector(job, role: str) -> str:
    return ",".join(f"{k}={v}" for k, v in labels(job, role).items())


def started(backend: KubernetesBackend, timeout: float = 60.0):
    """Reconcile until every wave runs (the trainer starts after the stream executors are Ready)."""

    def check():
        status = backend.reconcile()
        return (
            status
            if status.phase == "Running" and all(r.running >= r.desired for r in status.roles.values() if r.started)
            else None
        )

    return wait_for(f"job {backend.job.name} running", check, timeout=timeout, interval=0.3)


@pytest.fixture
def admin(kube_cluster):
    api = kube_cluster.client()
    apply_crd(api)
    return api


@pytest.fixture
def backend(admin, job_env, kube_namespaces):
    return KubernetesBackend(k8s_job(), cluster=Cluster(admin, kube_namespaces(admin), "a"))


def test_crd_accepts_the_demo_job_and_rejects_a_bad_one(admin, job_env):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from primus_lib.spec import load_job
    from tests.fixtures.specs import DEMO

    ns = new_namespace(admin)
    custom = client.CustomObjectsApi(admin)
    demo = load_job(DEMO)
    created = custom.create_namespaced_custom_object(m.GROUP, m.VERSION, ns, m.PLURAL, m.primusjob_object(demo, ns))
    assert created["spec"]["timer"]["window"] == "1h"
    assert created["spec"]["resources"]["roles"]["data_executor"]["max_replicas"] == 8
    status = {"status": {"phase": "Running"}}  # the PrimusJob's status is ours (the backend writes it)
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


def test_a_primusjob_created_and_deleted_by_another_process_during_ensure_cr_is_an_error(
    admin, job_env, kube_namespaces
):
    """ensure_cr reads (nothing), another submitter creates the PrimusJob, our create conflicts, the
    other deletes it, our re-read finds nothing: a clear ResourceError, not None for a dict."""
    cluster = Cluster(admin, kube_namespaces(admin), "a")
    other = KubernetesBackend(k8s_job(), cluster=cluster)
    reads = []

    class Racing(KubernetesBackend):
        def get_cr(self):
            reads.append(len(reads))
            if len(reads) == 1:  # after our read, before our create
                other.ensure_cr()
                return None
            m_args = (m.GROUP, m.VERSION, self.ns, m.PLURAL, self.job.name)
            other.cluster.custom.delete_namespaced_custom_object(*m_args)  # after our create conflicted
            return super().get_cr()

    with pytest.raises(ResourceError, match="created and deleted meanwhile"):
        Racing(k8s_job(), cluster=cluster).ensure_cr()
    assert reads == [0, 1] and other.get_cr() is None


def test_submit_runs_the_roles_in_start_order_on_nodes_without_duplicates(backend, kube_cluster):
    backend.submit()
    ns, c, job = backend.ns, backend.cluster, backend.job
    sts = c.apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns)
    assert sts.spec.replicas == 2
    pod = sts.spec.template.spec
    assert pod.security_context.run_as_non_root and pod.security_context.run_as_user == RUN_AS
    container = pod.containers[0]
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    assert container.resources.requests == {"cpu": "1", "memory": "2Gi"}
    assert container.command == ["primus", "stream-executor", SPEC_FILE]
    assert pod.automount_service_account_token is False
    assert sts.metadata.owner_references[0].kind == "PrimusJob"
    assert "job.yaml" in c.core.read_namespaced_config_map("ctr-demo-spec", ns).data
    assert c.core.read_namespaced_service("ctr-demo-trainer", ns).spec.cluster_ip == "None"
    assert [s.metadata.name for s in c.apps.list_namespaced_stateful_set(ns).items] == ["ctr-demo-stream-executor"]

    # the StatefulSet controller made the pods, the scheduler bound them, kwok runs them
    executors = running(c.api, ns, selector(job, "stream_executor"), n=2)
    assert {p.metadata.name for p in executors} == {"ctr-demo-stream-executor-0", "ctr-demo-stream-executor-1"}
    assert {p.spec.node_name for p in executors} <= {n.name for n in kube_cluster.nodes}
    status = started(backend)
    # the trainer started after the stream executors were Ready (they are that fast here: the wave
    # waiting on an unschedulable role is shown in test_pods_that_fit_no_node_stay_pending...)
    ready_at = max(c.last_transition_time for p in executors for c in p.status.conditions if c.type == "Ready")
    jobs = c.batch.list_namespaced_job(ns).items
    assert [j.metadata.name for j in jobs] == ["ctr-demo-trainer"]
    trainer = jobs[0]
    assert trainer.metadata.creation_timestamp >= ready_at
    assert trainer.spec.parallelism == 1 and trainer.spec.completions == 1
    assert trainer.spec.backoff_limit == 2
    assert trainer.spec.template.spec.subdomain == "ctr-demo-trainer"
    assert trainer.spec.template.spec.restart_policy == "Never"
    assert not backend.cluster.indexed_jobs  # 1.20: completionMode is not sent
    assert "completionMode" not in str(c.api.sanitize_for_serialization(trainer))
    [trainer_pod] = running(c.api, ns, selector(job, "trainer"), n=1)  # made by the Job controller
    assert trainer_pod.metadata.owner_references[0].kind == "Job"
    assert status.roles["trainer"].running == 1 and status.roles["stream_executor"].running == 2
    # idempotent: ensure_running again creates nothing new
    backend.ensure_running()
    assert len(c.batch.list_namespaced_job(ns).items) == 1
    assert len(c.apps.list_namespaced_stateful_set(ns).items) == 1
    assert len(pods(c.api, ns)) == 3
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


def test_scale_and_resize_go_through_the_controllers(backend):
    c, ns, job = backend.cluster, backend.ns, backend.job
    backend.submit()
    started(backend)
    executors = selector(job, "stream_executor")
    backend.scale("stream_executor", 3)
    assert c.apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns).spec.replicas == 3
    assert backend.get_cr()["spec"]["resources"]["roles"]["stream_executor"]["replicas"] == 3
    running(c.api, ns, executors, n=3)
    backend.scale("stream_executor", 99)  # clamped to max_replicas
    assert c.apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns).spec.replicas == 4
    running(c.api, ns, executors, n=4)
    # a new replica count is also a new N for every executor (its partition share): the template
    # changes and the controller rolls the pods, so wait for the rollout to settle
    wait_for(
        "4 stream executors running after the rollout", lambda: backend.role_status("stream_executor").running == 4
    )

    # resize: a template change; the StatefulSet controller replaces the pods one by one
    backend.resize("stream_executor", cpu=2.5, memory=3 * 2**30)
    sts = c.apps.read_namespaced_stateful_set("ctr-demo-stream-executor", ns)
    assert sts.spec.template.spec.containers[0].resources.requests == {"cpu": "2500m", "memory": "3Gi"}

    def rolled():
        found = running(c.api, ns, executors)
        new = [p for p in found if p.spec.containers[0].resources.requests == {"cpu": "2500m", "memory": "3Gi"}]
        return len(found) == len(new) == 4

    wait_for("all 4 stream executor pods replaced with 2.5 cores / 3 GiB", rolled, timeout=90)
    assert backend.role_status("stream_executor").cpu == 2.5

    # the trainer: a Job's template is immutable -> recreated once the old pod is gone
    [old_pod] = running(c.api, ns, selector(job, "trainer"), n=1)
    old_uid = c.batch.read_namespaced_job("ctr-demo-trainer", ns).metadata.uid
    backend.resize("trainer", memory=6 * 2**30)
    trainer = c.batch.read_namespaced_job("ctr-demo-trainer", ns)
    assert trainer.metadata.uid != old_uid
    assert trainer.spec.template.spec.containers[0].resources.limits["memory"] == "6Gi"
    [new_pod] = running(c.api, ns, selector(job, "trainer"), n=1)
    assert new_pod.metadata.uid != old_pod.metadata.uid
    assert new_pod.spec.containers[0].resources.requests["memory"] == "6Gi"
    with pytest.raises(ResourceError, match="Indexed Jobs"):  # 1.20: one trainer node without Indexed Jobs
        backend.scale("trainer", 2)


def test_pods_that_fit_no_node_stay_pending_and_status_says_so(admin, job_env, kube_namespaces):
    ns = kube_namespaces(admin)
    job = k8s_job(stream_cpu=20)  # a node has 16 cores
    backend = KubernetesBackend(job, cluster=Cluster(admin, ns, "a"))
    backend.submit()

    def unschedulable():
        status = backend.reconcile()
        return status if status.roles["stream_executor"].note.startswith("2 pod(s) Pending") else None

    status = wait_for("the scheduler reports both stream executors unschedulable", unschedulable)
    assert status.phase == "Pending"
    note = status.roles["stream_executor"].note
    assert note.startswith("2 pod(s) Pending, unschedulable: 0/2 nodes are available") and "Insufficient cpu" in note
    assert all(not p.spec.node_name for p in pods(admin, ns, selector(job, "stream_executor")))
    assert backend.cluster.batch.list_namespaced_job(ns).items == []  # the next wave waits
    assert backend.get_cr()["status"]["phase"] == "Pending"

    # resized to fit, the StatefulSet controller replaces the Pending pods and the job starts
    backend.resize("stream_executor", cpu=10)
    status = started(backend, timeout=90)
    assert status.roles["stream_executor"].running == 2 and status.message == ""
    # scaled out past the nodes: 10 + 10 cores fit no 16-core node twice -> 2 more Pending
    backend.scale("stream_executor", 4)
    running(admin, ns, selector(job, "stream_executor"), n=2)
    status = wait_for("two pods unschedulable", lambda: (s := backend.status()).message.count("2 pod(s)") and s)
    assert status.phase == "Running"  # the role runs, short of two pods
    assert status.roles["stream_executor"].running == 2 and status.roles["stream_executor"].desired == 4
    assert status.roles["stream_executor"].note.startswith("2 pod(s) Pending, unschedulable")


def test_trainer_failover_by_the_job_controller_then_critical_failure(admin, job_env, kube_namespaces):
    ns = kube_namespaces(admin)
    job = k8s_job(max_restarts=1)  # backoffLimit 1: one replacement pod
    backend = KubernetesBackend(job, cluster=Cluster(admin, ns, "a"))
    backend.submit()
    started(backend)
    [first] = running(admin, ns, selector(job, "trainer"), n=1)
    simulate_exit(admin, ns, first.metadata.name, 1)  # SIMULATION: the trainer process exits with 1

    def replaced():
        found = running(admin, ns, selector(job, "trainer"))
        return [p for p in found if p.metadata.uid != first.metadata.uid]

    [second] = wait_for("the Job controller's replacement trainer pod running", replaced, timeout=60)
    status = backend.ensure_running()
    assert status.phase == "Running" and status.roles["trainer"].restarts == 1

    simulate_exit(admin, ns, second.metadata.name, 1)  # SIMULATION: fails again -> backoffLimit reached

    # Read the Job controller's verdict before asking the backend: once the backend sees the
    # failure it deletes the workloads, the trainer Job included.
    def job_conditions():
        conditions = backend.cluster.batch.read_namespaced_job("ctr-demo-trainer", ns).status.conditions
        return [(c.type, c.reason) for c in conditions or []] or None

    conditions = wait_for("the Job controller gives up (BackoffLimitExceeded)", job_conditions, timeout=60)
    assert conditions == [("Failed", "BackoffLimitExceeded")]
    status = backend.ensure_running()
    assert status.phase == "Failed" and "trainer" in status.message and "backoffLimit" in status.message
    backend.reconcile()
    assert backend.cluster.apps.list_namespaced_stateful_set(ns).items == []  # the other roles stopped
    wait_for("stream executor pods deleted", lambda: not pods(admin, ns, selector(job, "stream_executor")))
    assert backend.get_cr()["status"]["phase"] == "Failed"


def test_trainer_success_completes_the_job_and_stops_the_other_roles(admin, job_env, kube_namespaces):
    ns = kube_namespaces(admin)
    job = k8s_job()
    backend = KubernetesBackend(job, cluster=Cluster(admin, ns, "a"))
    backend.submit()
    started(backend)
    [trainer] = running(admin, ns, selector(job, "trainer"), n=1)
    simulate_exit(admin, ns, trainer.metadata.name, 0)  # SIMULATION: the trainer process exits with 0

    def succeeded():
        status = backend.ensure_running()
        return status if status.phase == "Succeeded" else None

    wait_for("the Job controller marks the trainer Job Complete", succeeded)
    assert backend.reconcile().phase == "Succeeded"
    assert backend.cluster.apps.list_namespaced_stateful_set(ns).items == []
    assert [j.metadata.name for j in backend.cluster.batch.list_namespaced_job(ns).items] == ["ctr-demo-trainer"]
    assert backend.get_cr()["status"]["phase"] == "Succeeded"
    assert backend.ensure_running().phase == "Succeeded"  # a finished job is reported, not restarted


def test_stream_executor_restarts_beyond_max_fail_the_role(admin, job_env, kube_namespaces):
    ns = kube_namespaces(admin)
    roles = {
        "data_executor": {"replicas": 1, "image": "i"},
        "stream_executor": {
            "replicas": 1,
            "image": "i",
            "critical": True,
            "max_restarts": 1,
            "command": ["primus", "x"],
        },
        "trainer": {"image": "i", "command": ["sleep", "1"], "start_after": ["stream_executor"]},
    }
    job = load(demo_doc(roles=roles, backend="kubernetes"), check=False)
    backend = KubernetesBackend(job, cluster=Cluster(admin, ns))
    backend.submit()
    [pod] = running(admin, ns, selector(job, "stream_executor"), n=1)
    simulate_restarts(admin, ns, pod.metadata.name, 2)  # SIMULATION: its container crashed twice

    def failed():
        status = backend.status()
        return status if status.phase == "Failed" else None

    status = wait_for("the role fails after 2 > max_restarts restarts", failed)
    assert status.roles["stream_executor"].restarts == 2
    assert "max_restarts" in status.message


def test_pytorchjob_when_the_kubeflow_crd_exists(kube_apiserver_b, job_env):
    """The PyTorchJob objects only: no Kubeflow training operator runs here, so no pods appear."""
    import time

    from kubernetes import client

    api = kube_apiserver_b.client()
    apply_crd(api)
    ext = client.ApiextensionsV1Api(api)
    pytorch_crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "pytorchjobs.kubeflow.org"},
        "spec": {
            "group": "kubeflow.org",
            "scope": "Namespaced",
            "names": {"plural": "pytorchjobs", "singular": "pytorchjob", "kind": "PyTorchJob"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    ext.create_custom_resource_definition(pytorch_crd)
    try:
        ns = new_namespace(api)
        cluster = Cluster(api, ns, "b")
        deadline = time.monotonic() + 20
        while not cluster.has_pytorchjob and time.monotonic() < deadline:
            del cluster.__dict__["has_pytorchjob"]
            time.sleep(0.2)
        roles = {
            "data_executor": {"replicas": 1, "image": "i"},
            "trainer": {"replicas": 3, "max_replicas": 8, "image": "primus:1", "gpu": 8},
        }
        job = load(demo_doc(roles=roles, backend="kubernetes"), check=False)
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
    assert {"ConfigMap", "Job", "PrimusJob", "Service", "StatefulSet"} <= set(seen)
