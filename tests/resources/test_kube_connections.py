"""The job's connections on Kubernetes (primus_lib.credentials: a role process reads mounted secret
files): the submitter (an Airflow task, with Airflow's connections) writes the connections the spec
names into the Secret ``<job>-connections``, which the controller creates and cannot read back, and
every pod mounts it at ``$PRIMUS_SECRETS_DIR``; no secret lands in the CR, the ConfigMap or a pod spec.
Against the real control plane (tests/fixtures/kube.py). No container runs here (kwok): the kubelet's
part, one file per key, is done by the test itself from the Secret as the API server stored it."""

from __future__ import annotations

import base64
from pathlib import Path

from kubernetes import client

from primus_lib.credentials import Connection, Resolver, S3Credentials, SecretFiles, using, write_secret_files
from primus_lib.resources.kubernetes import manifests as m
from primus_lib.resources.kubernetes.backend import KubernetesBackend
from primus_lib.resources.kubernetes.cluster import Cluster
from primus_lib.resources.kubernetes.names import CONNECTIONS_MOUNT, connections_secret_name, spec_configmap_name
from primus_lib.resources.kubernetes.pods import pod_template
from tests.reliability.test_security_kube import pod_specs
from tests.resources.conftest import apply_crd
from tests.resources.test_kubernetes import k8s_job, started
from tests.resources.test_rbac import as_controller, denied

SECRET_KEY = "lake-secret-5d2f81"  # the connection's password: only in the Secret
LAKE = Connection("lake", "aws", login="AKIALAKE", password=SECRET_KEY, extra={"endpoint_url": "http://s3.lake:8333"})


def lake_job(name: str = "conn-job"):
    return k8s_job(name=name, storage={"root": "s3://lake-bucket/jobs", "connection_id": "lake"})


def test_every_role_mounts_the_connections_secret_at_its_secrets_dir(job_env):
    job = lake_job()
    for role in ("data_executor", "stream_executor", "trainer"):
        pod = pod_template(job, role, "Always", cmd=["x"])["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "connections")
        assert volume["secret"] == {"secretName": "conn-job-connections", "defaultMode": 0o440, "optional": True}
        container = pod["containers"][0]
        mount = next(v for v in container["volumeMounts"] if v["name"] == "connections")
        assert mount == {"name": "connections", "mountPath": CONNECTIONS_MOUNT, "readOnly": True}
        assert {"name": "PRIMUS_SECRETS_DIR", "value": CONNECTIONS_MOUNT} in container["env"], role


def test_the_submitter_hands_its_connections_to_the_pods_through_a_secret(
    kube_cluster, job_env, kube_namespaces, tmp_path
):
    admin, ns, controller = as_controller(kube_cluster, kube_namespaces)
    job = lake_job()
    submitter = Resolver(SecretFiles(write_secret_files(tmp_path / "airflow", [LAKE])))  # as Airflow resolves it
    backend = KubernetesBackend(job, cluster=Cluster(controller, ns))
    with using(submitter):
        backend.submit()
    started(backend)
    core = client.CoreV1Api(admin)

    stored = core.read_namespaced_secret(connections_secret_name(job), ns)
    assert set(stored.data) == {"lake.json"} and stored.metadata.owner_references[0].kind == "PrimusJob"
    assert denied(lambda: client.CoreV1Api(controller).read_namespaced_secret(connections_secret_name(job), ns))
    with using(Resolver(SecretFiles(None))):  # a submitter without the connection: the Secret stays as it was
        backend.prepare()
    assert core.read_namespaced_secret(connections_secret_name(job), ns).data == stored.data

    # the kubelet's part: one file per key under the mount; the pod's resolver reads the credentials
    mounted = tmp_path / "pod" / CONNECTIONS_MOUNT.strip("/")
    mounted.mkdir(parents=True)
    for key, value in stored.data.items():
        (mounted / key).write_bytes(base64.b64decode(value))
    in_pod = Resolver(SecretFiles(mounted)).storage(job.spec.storage.connection_id, uri=job.spec.storage.root or "")
    assert in_pod == S3Credentials("AKIALAKE", SECRET_KEY, "http://s3.lake:8333", None)

    # every stored template and pod mounts it; no object but the Secret holds the key
    specs = pod_specs(admin, ns, job)
    assert len(specs) >= 5, sorted(specs)  # 2 workloads' templates + their 3 pods
    for name, spec in specs.items():
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["connections"]["secret"]["secretName"] == connections_secret_name(job), name
        assert SECRET_KEY not in str(spec), f"{name}: the connection's secret in the pod spec"
    config = core.read_namespaced_config_map(spec_configmap_name(job), ns)
    cr = client.CustomObjectsApi(admin).get_namespaced_custom_object(m.GROUP, m.VERSION, ns, m.PLURAL, job.name)
    assert SECRET_KEY not in str(config.data) + str(cr)
    assert not Path(CONNECTIONS_MOUNT).exists()  # nothing of it on this host's disk


def test_a_submitter_with_no_connections_makes_no_secret(kube_cluster, job_env, kube_namespaces):
    admin = kube_cluster.client()
    apply_crd(admin)
    ns = kube_namespaces(admin)
    job = lake_job("bare-job")
    backend = KubernetesBackend(job, cluster=Cluster(admin, ns))
    with using(Resolver(SecretFiles(None))):
        backend.submit()
    assert started(backend).phase == "Running"
    names = [s.metadata.name for s in client.CoreV1Api(admin).list_namespaced_secret(ns).items]
    assert connections_secret_name(job) not in names
