"""The pod_mutation_hook (plugins/primus_operators/policies.py): a mapped data task's worker pod,
built by the cncf-kubernetes provider's PodGenerator from the parsed DAG's serialized
executor_config, gets the data_executor allotment recorded in the job's state on S3 (SeaweedFS)
AFTER the parse; the real kube-scheduler places (or refuses) the pod by those resources."""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from airflow import settings
from airflow.dag_processing.dagbag import DagBag
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from airflow.serialization.serialized_objects import DagSerialization
from kubernetes.client import CoreV1Api
from kubernetes.client import models as k8s
from primus_operators.policies import ALLOCATIONS_ANNOTATION, ROLE_ANNOTATION

from primus_lib.allocation import allocations_dir, record_allocation
from primus_lib.spec import load_job
from primus_lib.storage import StorageLocation
from tests.airflow.test_dag_factory import KUBE_ROLES, _sync
from tests.fixtures.airflow import copy_dags
from tests.fixtures.specs import airflow_doc, write_spec

pytestmark = pytest.mark.integration
TASK = "history.execute_impressions"
GiB = 2**30


@pytest.fixture
def policy_plugin(monkeypatch):
    """The policy as Airflow installs it at startup: its ``airflow.policy`` entry point (the
    installed package's metadata), loaded into a fresh policy plugin manager (restored afterwards)."""
    fresh = functools.cache(settings.get_policy_plugin_manager.__wrapped__)
    monkeypatch.setattr(settings, "get_policy_plugin_manager", fresh)
    settings.load_policy_plugins(fresh())
    assert [h.plugin_name for h in fresh().hook.pod_mutation_hook.get_hookimpls()] == ["primus"]


@pytest.fixture
def kube_job(s3_env, monkeypatch, tmp_path):
    """A kubernetes-backend job whose state lives in a fresh S3 bucket, parsed by the DAG factory."""
    bucket = f"primus-{uuid.uuid4().hex[:8]}"
    s3_env.filesystem().create_dir(bucket)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    storage = {"root": f"s3://{bucket}/jobs"}
    write_spec(jobs / "kube.yaml", airflow_doc("kube", backend="kubernetes", roles=KUBE_ROLES, storage=storage))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    return jobs / "kube.yaml"


def _parsed_override(spec: Path, tmp_path: Path, monkeypatch) -> k8s.V1Pod:
    """The data task's pod_override as the scheduler holds it: parsed once, serialized, deserialized."""
    dags = copy_dags(tmp_path / "dags")
    _sync(dags, spec.parent, monkeypatch)
    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}
    scheduled = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["kube"]))
    return scheduled.get_task(TASK).partial_kwargs["executor_config"]["pod_override"]


def _worker_pod(override: k8s.V1Pod, map_index: int) -> k8s.V1Pod:
    """What the KubernetesExecutor creates for one mapped instance: the pod template's pod, the
    executor's dynamic pod and the pod_override reconciled, then the mutation hook."""
    template = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(labels={"app": "primus-worker"}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", image="primus:1")], restart_policy="Never"),
    )
    return PodGenerator.construct_pod(
        dag_id="kube",
        task_id=TASK,
        pod_id=f"kube-execute-{uuid.uuid4().hex[:6]}",
        try_number=1,
        kube_image="primus:1",
        date=None,
        args=["airflow", "tasks", "run", "kube", TASK],
        pod_override_object=copy.deepcopy(override),
        base_worker_pod=template,
        namespace="default",
        scheduler_job_id="7",
        run_id="scheduled__2026-11-01T00:00:00+00:00",
        map_index=map_index,
        with_mutation_hook=True,
    )


def _base(pod: k8s.V1Pod) -> k8s.V1ResourceRequirements:
    return next(c for c in pod.spec.containers if c.name == "base").resources


def test_a_resize_after_the_parse_sizes_the_next_worker_pod(
    kube_job, policy_plugin, tmp_path, monkeypatch, kube_cluster
):
    job = load_job(kube_job, env={"PRIMUS_DATA": str(tmp_path / "data")})
    where = allocations_dir(job)
    assert isinstance(where, StorageLocation) and str(where).startswith("s3://")
    override = _parsed_override(kube_job, tmp_path, monkeypatch)

    before = _worker_pod(override, map_index=3)
    assert before.metadata.annotations[ROLE_ANNOTATION] == "data_executor"
    assert before.metadata.annotations[ALLOCATIONS_ANNOTATION] == str(where)
    assert before.metadata.annotations["map_index"] == "3"  # the executor's own marks are kept
    assert _base(before).requests == {"cpu": "1", "memory": "1Gi"} == _base(before).limits

    # The scaler resizes the role (what scaling_step records); the DAG is NOT parsed again for
    # the next pod's override, yet the pod carries the new size, read back from S3.
    record_allocation(where, "data_executor", 12.0, 40 * GiB)
    assert (where / "resources.json").exists()
    after = _worker_pod(override, map_index=4)
    assert override.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}  # stale, as parsed
    assert _base(after).requests == {"cpu": "12", "memory": "40Gi"} == _base(after).limits

    # Larger than any node (16 cores): the real scheduler must refuse the mutated pod.
    record_allocation(where, "data_executor", 20.0, 8 * GiB)
    too_big = _worker_pod(override, map_index=5)
    assert _base(too_big).requests == {"cpu": "20", "memory": "8Gi"}

    core = CoreV1Api(kube_cluster.client())
    api = core.api_client
    for pod in (after, too_big):
        core.create_namespaced_pod("default", api.sanitize_for_serialization(pod))
    try:
        placed = _wait(core, after.metadata.name, lambda p: bool(p.spec.node_name))
        assert placed.spec.node_name.startswith("kwok-a-")
        assert placed.spec.containers[0].resources.requests == {"cpu": "12", "memory": "40Gi"}
        refused = _wait(core, too_big.metadata.name, _unschedulable)
        assert refused.spec.node_name is None
    finally:
        for pod in (after, too_big):
            core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)


def test_pods_of_other_tasks_and_unreadable_state_keep_their_resources(policy_plugin, monkeypatch, tmp_path):
    from airflow.settings import pod_mutation_hook

    plain = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(annotations={"dag_id": "other"}),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="base", resources=k8s.V1ResourceRequirements(requests={"cpu": "2"}))]
        ),
    )
    pod_mutation_hook(plain)
    assert plain.spec.containers[0].resources.requests == {"cpu": "2"}

    (tmp_path / "scaling").mkdir()
    (tmp_path / "scaling" / "resources.json").write_text("{")
    plain.metadata.annotations.update(
        {ROLE_ANNOTATION: "data_executor", ALLOCATIONS_ANNOTATION: str(tmp_path / "scaling")}
    )
    pod_mutation_hook(plain)  # a broken resources.json: the parse-time sizing stays, the pod is created
    assert plain.spec.containers[0].resources.requests == {"cpu": "2"}

    record_allocation(tmp_path / "scaling2", "data_executor", 0.5, 3 * GiB)
    plain.metadata.annotations[ALLOCATIONS_ANNOTATION] = str(tmp_path / "scaling2")
    pod_mutation_hook(plain)
    assert plain.spec.containers[0].resources.limits == {"cpu": "500m", "memory": "3Gi"}


def _unschedulable(pod) -> bool:
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in pod.status.conditions or [])


def _wait(core, name: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        pod = core.read_namespaced_pod(name, "default")
        if check(pod):
            return pod
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {name}: {pod.status}")
        time.sleep(0.5)


def test_the_store_is_read_with_the_storage_connection(kube_job, s3_env, policy_plugin, tmp_path, monkeypatch, caplog):
    """spec.storage.connection_id: the scheduler has no AWS_* variables, only the Airflow connection
    (AIRFLOW_CONN_*); the DAG processor cannot read the state (the spec's size), the hook can."""
    from primus_operators.policies import CONNECTION_ANNOTATION

    from primus_lib.credentials import Connection, Resolver, using

    conn = s3_env.connection()  # the s3_env fixture's store
    secret = conn["password"]
    doc = yaml.safe_load(kube_job.read_text())
    doc["spec"]["storage"]["connection_id"] = "state_s3"
    write_spec(kube_job, doc)
    monkeypatch.delenv("PRIMUS_SECRETS_DIR")  # the scheduler has no secret files, only the Airflow connection
    monkeypatch.setenv("AIRFLOW_CONN_STATE_S3", json.dumps(conn))
    job = load_job(kube_job, env={"PRIMUS_DATA": str(tmp_path / "data")})
    scaler = Resolver(type("One", (), {"connection": lambda self, c: Connection(c, **conn)})())
    with using(scaler):  # the scaler's decision, recorded before the parse
        record_allocation(allocations_dir(job), "data_executor", 3.0, 6 * GiB)
    caplog.set_level(logging.DEBUG)

    override = _parsed_override(kube_job, tmp_path, monkeypatch)
    assert override.metadata.annotations[CONNECTION_ANNOTATION] == "state_s3"
    assert override.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}  # no credentials here
    assert _base(_worker_pod(override, map_index=0)).requests == {"cpu": "3", "memory": "6Gi"}
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ  # nothing written to the environment

    monkeypatch.delenv("AIRFLOW_CONN_STATE_S3")  # a connection the scheduler lacks: the parse-time size
    assert _base(_worker_pod(override, map_index=1)).requests == {"cpu": "1", "memory": "1Gi"}
    assert "keeps its parse-time resources" in caplog.text and secret not in caplog.text


@pytest.mark.parametrize(
    ("command", "task_modules"),
    [
        ([], False),
        (["dag-processor"], False),
        (["api-server"], False),
        (["scheduler"], True),
        (["celery", "worker"], True),
    ],
)
def test_every_airflow_process_loads_the_policy_and_what_its_forks_need(tmp_path, command, task_modules):
    """The entry point is what installs the hook. Every process then holds the spec model and the
    operators (the DAG processor forks per DAG file after this start: bench/dag_parse.py); those
    whose forks run tasks (LocalExecutor's scheduler, a Celery worker) also the data task's and
    the Joiner's modules (bench/executor.py), never torch; the others stay without them."""
    probe = (
        "import sys, airflow\n"
        "from airflow.settings import get_policy_plugin_manager\n"
        "impls = get_policy_plugin_manager().hook.pod_mutation_hook.get_hookimpls()\n"
        "print([h.plugin_name for h in impls], 'primus_lib.spec.job' in sys.modules,"
        " 'primus_operators.operators.trainer' in sys.modules,"
        " 'primus_lib.data.executor.task' in sys.modules, 'primus_lib.data.executor.join' in sys.modules,"
        " 'pyarrow' in sys.modules, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    out = subprocess.run(
        [sys.executable, "-c", probe, *command], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    loaded = out.stdout.strip().splitlines()[-1]
    expected = f"['primus'] True True {task_modules} {task_modules} {task_modules} False"
    assert loaded == expected, out.stderr[-2000:]


def _mapped(pid: int, library: str) -> bool:
    return library in Path(f"/proc/{pid}/maps").read_text()


def test_the_scheduler_and_its_workers_hold_the_data_tasks_modules(airflow_server):
    """The real ``airflow standalone`` (the test session's, LocalExecutor): its scheduler and the
    LocalExecutor workers it forked, whose forks run every task, have pyarrow's library mapped.
    (That the other commands are not warmed is the fresh-process test above: in this shared session
    the API server and the triggerer may have loaded pyarrow themselves, serving earlier tests.)"""
    import psutil

    components: dict[str, list[psutil.Process]] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            argv = proc.cmdline()
        except psutil.Error:
            continue
        if len(argv) >= 3 and Path(argv[1]).name == "airflow" and argv[2] == "scheduler":
            components.setdefault("scheduler", []).append(proc)
        elif argv and argv[0].startswith("airflow worker -- LocalExecutor"):
            components.setdefault("worker", []).append(proc)
    assert set(components) == {"scheduler", "worker"}, components
    for name, procs in components.items():
        for proc in procs:
            assert _mapped(proc.pid, "libarrow"), f"{name} {proc.pid} has not loaded the data task's modules"
