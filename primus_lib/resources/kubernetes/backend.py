"""Runs a PrimusJob on one Kubernetes cluster through the API server.

The PrimusJob custom resource is the job's record (spec = desired roles, status = phase and
roles); its workloads carry ownerReferences to it. Start order: a wave of roles is created when
every role of the previous waves is ready (all its pods Running and Ready on a node). A pod the
scheduler finds no node for stays Pending; status() names it and the scheduler's reason. Failover: the Job
controller restarts failed trainer pods up to backoffLimit = max_restarts x replicas; a
StatefulSet's pod restarting more than max_restarts times fails its role (and the job if critical).
Scaling the stream executors patches their replicas and $PRIMUS_REPLICAS in the pod template (each
executor's N: the pods roll); their headless Service is how the trainer finds them, their NetworkPolicy
admits only the job's trainer pods, and the Secret ``<job>-flight`` (made once, never read back) is
the Flight token both mount. Resize patches
the pod templates (a rolling update); a Job's template is immutable, so a trainer resize or a
scale-up past its completions recreates the Job once the old one's pods are gone (foreground
deletion, primus_lib/resources/kubernetes/trainer.py; the trainer resumes from its checkpoint).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from primus_lib.credentials import current
from primus_lib.resources import roles as role_rules
from primus_lib.resources.base import JobStatus, Phase, ResourceBackend, ResourceError, RoleStatus
from primus_lib.resources.kubernetes import manifests as m
from primus_lib.resources.kubernetes.cluster import Cluster, api_client_for
from primus_lib.resources.kubernetes.names import (
    EXECUTOR_ROLE,
    INDEXED_JOB_MIN,
    PYTORCHJOB,
    executor_service_name,
    labels,
    spec_configmap_name,
    trainer_service_name,
    workload_name,
)
from primus_lib.resources.kubernetes.pods import command as container_command
from primus_lib.resources.kubernetes.pods import has_executors
from primus_lib.resources.kubernetes.pods import resources as container_resources
from primus_lib.resources.kubernetes.role_status import read_role_status
from primus_lib.resources.kubernetes.trainer import recreate_trainer
from primus_lib.spec.job import PrimusJob

MERGE = {"_content_type": "application/merge-patch+json"}
JSON_PATCH = {"_content_type": "application/json-patch+json"}


def _not_found(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 404


def _conflict(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 409


class KubernetesBackend(ResourceBackend):
    name = "kubernetes"

    def __init__(
        self,
        job: PrimusJob,
        spec_path: str | None = None,
        cluster: Cluster | None = None,
        roles: Iterable[str] | None = None,
    ) -> None:
        super().__init__(job, spec_path)
        if cluster is None:  # in-cluster config, else the kubeconfig ($KUBECONFIG, read by the client itself)
            from primus_lib.settings import settings

            namespace = settings().kube_namespace or job.metadata.namespace or job.spec.resources.namespace
            cluster = Cluster(api_client_for(), namespace)
        self.cluster = cluster
        self.ns = self.cluster.namespace
        self.only = set(roles) if roles is not None else None

    # -- what this backend runs -------------------------------------------------------------
    def roles(self) -> list[str]:
        names = list(self.job.spec.resources.roles)
        return [r for r in names if self.only is None or r in self.only]

    def runnable(self, role: str) -> bool:
        return container_command(self.job, role) is not None

    def trainer_kind(self) -> str:
        return "pytorchjob" if self.cluster.has_pytorchjob else "job"

    # -- the custom resource ----------------------------------------------------------------
    def get_cr(self) -> dict | None:
        from kubernetes.client.rest import ApiException

        try:
            return self.cluster.custom.get_namespaced_custom_object(
                m.GROUP, m.VERSION, self.ns, m.PLURAL, self.job.name
            )
        except ApiException as exc:
            if _not_found(exc):
                return None
            raise

    def ensure_cr(self) -> dict:
        from kubernetes.client.rest import ApiException

        existing = self.get_cr()
        if existing is not None:
            return existing
        try:
            return self.cluster.custom.create_namespaced_custom_object(
                m.GROUP, m.VERSION, self.ns, m.PLURAL, m.primusjob_object(self.job, self.ns)
            )
        except ApiException as exc:
            if _conflict(exc):
                return self._created_meanwhile()
            raise ResourceError(f"job {self.job.name!r}: the API server rejected the PrimusJob: {exc.body}") from exc

    def _created_meanwhile(self) -> dict:
        """The PrimusJob another process created between our read and our create."""
        existing = self.get_cr()
        if existing is None:
            raise ResourceError(f"job {self.job.name!r}: the PrimusJob was created and deleted meanwhile; retry")
        return existing

    def set_cr_status(self, status: JobStatus) -> None:
        body = {
            "status": {
                "phase": status.phase,
                "message": status.message,
                "roles": {
                    n: {
                        "desired": r.desired,
                        "running": r.running,
                        "restarts": r.restarts,
                        "succeeded": r.succeeded,
                        "failed": r.failed,
                    }
                    for n, r in status.roles.items()
                    if n in self.roles()
                },
            }
        }
        self.cluster.custom.patch_namespaced_custom_object_status(
            m.GROUP, m.VERSION, self.ns, m.PLURAL, self.job.name, body, **MERGE
        )

    def patch_cr_role(self, role: str, change: dict[str, Any]) -> None:
        body = {"spec": {"resources": {"roles": {role: m.quantities(change)}}}}
        self.cluster.custom.patch_namespaced_custom_object(
            m.GROUP, m.VERSION, self.ns, m.PLURAL, self.job.name, body, **MERGE
        )

    # -- creating objects -------------------------------------------------------------------
    def _create(self, create, body: dict) -> None:
        from kubernetes.client.rest import ApiException

        try:
            create(self.ns, body)
        except ApiException as exc:
            if not _conflict(exc):  # 409: it exists already -> reattach, never duplicate
                raise ResourceError(
                    f"job {self.job.name!r}: creating {body['kind']} {body['metadata']['name']} failed: {exc.body}"
                ) from exc

    def prepare(self) -> str:
        """The CR, the spec ConfigMap, the connections Secret, (with a trainer here) the headless Service
        and the trainers' policy, and the executors' Service, policy and token; returns the CR uid."""
        uid = self.ensure_cr()["metadata"]["uid"]
        self._create(self.cluster.core.create_namespaced_config_map, m.spec_configmap(self.job, uid))
        if "trainer" in self.roles():
            self._create(self.cluster.core.create_namespaced_service, m.trainer_service(self.job, uid))
            policy = m.trainer_network_policy(self.job, uid)  # the rendezvous and collectives: ranks only
            self._create(self.cluster.networking.create_namespaced_network_policy, policy)
        if EXECUTOR_ROLE in self.roles() and self.runnable(EXECUTOR_ROLE):  # the trainer finds them here
            self._create(self.cluster.core.create_namespaced_service, m.executor_service(self.job, uid))
            policy = m.executor_network_policy(self.job, uid)
            self._create(self.cluster.networking.create_namespaced_network_policy, policy)
        connections = current().mountable(self.job.connection_ids())  # as this submitter resolves them
        if connections:  # 409: the Secret is kept (never read back; rotate by deleting it)
            self._create(self.cluster.core.create_namespaced_secret, m.connections_secret(self.job, connections, uid))
        if has_executors(self.job) and {EXECUTOR_ROLE, "trainer"} & set(self.roles()):  # 409: token kept
            token = m.flight_secret(self.job, secrets.token_urlsafe(32), uid)
            self._create(self.cluster.core.create_namespaced_secret, token)
        return uid

    def workload(self, role: str, uid: str | None, replicas=None, cpu=None, memory=None) -> dict:
        if role != role_rules.TRAINER_ROLE:
            return m.statefulset(self.job, role, uid, replicas, cpu, memory)
        if self.trainer_kind() == "pytorchjob":
            return m.pytorch_job(self.job, uid, replicas, cpu, memory)
        n = self.job.spec.resources.roles[role].replicas if replicas is None else replicas
        if n > 1 and not self.cluster.indexed_jobs:
            raise ResourceError(
                f"job {self.job.name!r}: {n} trainer nodes need Indexed Jobs (Kubernetes >= "
                f"{'.'.join(map(str, INDEXED_JOB_MIN))}, this server is {'.'.join(map(str, self.cluster.version))}) "
                "or the Kubeflow PyTorchJob CRD"
            )
        return m.trainer_job(self.job, self.cluster.indexed_jobs, uid, n, cpu, memory)

    def create_role(self, role: str, uid: str | None = None) -> None:
        if not self.runnable(role):
            return
        uid = uid or self.prepare()
        body = self.workload(role, uid)
        if body["kind"] == "StatefulSet":
            self._create(self.cluster.apps.create_namespaced_stateful_set, body)
        elif body["kind"] == "Job":
            self._create(self.cluster.batch.create_namespaced_job, body)
        else:
            group, version, plural = PYTORCHJOB
            self._create(
                lambda ns, b: self.cluster.custom.create_namespaced_custom_object(group, version, ns, plural, b), body
            )

    # -- reading objects --------------------------------------------------------------------
    def read_workload(self, role: str) -> dict | None:
        from kubernetes.client.rest import ApiException

        name = workload_name(self.job, role)
        try:
            if role != role_rules.TRAINER_ROLE:
                obj = self.cluster.apps.read_namespaced_stateful_set(name, self.ns)
            elif self.trainer_kind() == "pytorchjob":
                group, version, plural = PYTORCHJOB
                return self.cluster.custom.get_namespaced_custom_object(group, version, self.ns, plural, name)
            else:
                obj = self.cluster.batch.read_namespaced_job(name, self.ns)
        except ApiException as exc:
            if _not_found(exc):
                return None
            raise
        return self.cluster.api.sanitize_for_serialization(obj)

    def pods(self, role: str) -> list:
        """The role's pods (any revision), as the controllers created them."""
        selector = ",".join(f"{k}={v}" for k, v in labels(self.job, role).items())
        return self.cluster.core.list_namespaced_pod(self.ns, label_selector=selector).items

    def role_status(self, role: str) -> RoleStatus:
        return read_role_status(self, role)

    def role_ready(self, status: RoleStatus) -> bool:
        if not self.runnable(status.name):
            return True
        return status.started and (status.running >= status.desired or status.succeeded >= status.desired)

    # -- the interface ----------------------------------------------------------------------
    def status(self) -> JobStatus:
        cr = self.get_cr()
        roles = {r: self.role_status(r) for r in self.roles()}
        if cr is None:
            return JobStatus(self.job.name, "Stopped", roles, "no PrimusJob object")
        recorded = (cr.get("status") or {}).get("phase")
        if recorded == "Stopped" and not any(r.started for r in roles.values()):
            return JobStatus(self.job.name, "Stopped", roles, "stopped")
        for name, r in roles.items():
            if r.failed and role_rules.is_critical(self.job, name):
                return JobStatus(self.job.name, "Failed", roles, f"critical role {name!r} failed: {r.note}")
        trainer = roles.get(role_rules.TRAINER_ROLE)
        if trainer is not None and trainer.started and trainer.succeeded >= trainer.desired > 0:
            return JobStatus(self.job.name, "Succeeded", roles, "every trainer worker completed")
        if recorded in ("Succeeded", "Failed"):
            return JobStatus(self.job.name, recorded, roles, (cr.get("status") or {}).get("message", ""))
        started = [r for r in roles.values() if r.started or not self.runnable(r.name)]
        waiting = {n: r for n, r in roles.items() if "unschedulable" in r.note}
        message = "; ".join(f"role {n!r}: {r.note}" for n, r in waiting.items())
        stuck = any(r.running == 0 for r in waiting.values())  # a role with no pod running at all
        phase: Phase = "Running" if len(started) == len(roles) and not stuck else "Pending"
        return JobStatus(self.job.name, phase, roles, message)

    def reconcile(self) -> JobStatus:
        """Create the next wave of roles when the previous ones are ready; settle terminal phases."""
        uid = self.prepare()
        current = self.status()
        if current.phase in ("Failed", "Succeeded"):
            self._delete_workloads(keep_trainer=current.phase == "Succeeded")
            self.set_cr_status(current)
            return current
        mine = set(self.roles())
        for wave in role_rules.start_order(self.job):
            wave = [r for r in wave if r in mine]
            for role in wave:
                if not current.roles[role].started:
                    self.create_role(role, uid)
            if not all(self.role_ready(self.role_status(r)) for r in wave):
                break
        current = self.status()
        self.set_cr_status(current)
        return current

    def submit(self) -> JobStatus:
        return self.reconcile()

    def ensure_running(self) -> JobStatus:
        current = self.status()
        if current.phase in ("Succeeded", "Failed"):
            return current
        return self.reconcile()

    def scale(self, role: str, replicas: int) -> None:
        n = self.check_replicas(role, replicas)
        name = workload_name(self.job, role)
        obj = self.read_workload(role)
        if obj is None:
            raise ResourceError(f"job {self.job.name!r}: role {role!r} has no workload to scale (not started)")
        if obj["kind"] == "StatefulSet" and role == EXECUTOR_ROLE:  # N changes too: the pods roll
            self.cluster.apps.patch_namespaced_stateful_set(name, self.ns, m.replicas_patch(obj, n), **JSON_PATCH)
        elif obj["kind"] == "StatefulSet":
            self.cluster.apps.patch_namespaced_stateful_set_scale(name, self.ns, {"spec": {"replicas": n}}, **MERGE)
        elif obj["kind"] == "Job":
            if n <= obj["spec"]["completions"]:
                self.cluster.batch.patch_namespaced_job(name, self.ns, {"spec": {"parallelism": n}}, **MERGE)
            else:
                recreate_trainer(self, obj, replicas=n)
        else:
            group, version, plural = PYTORCHJOB
            body = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": max(0, n - 1)}}}}
            self.cluster.custom.patch_namespaced_custom_object(group, version, self.ns, plural, name, body, **MERGE)
        self.patch_cr_role(role, {"replicas": n})

    def resize(self, role: str, cpu: float | None = None, memory: float | None = None) -> None:
        spec = self.role_spec(role)
        obj = self.read_workload(role)
        if obj is None:
            raise ResourceError(f"job {self.job.name!r}: role {role!r} has no workload to resize (not started)")
        current = self.role_status(role)
        cpu = current.cpu if cpu is None else cpu
        memory = current.memory if memory is None else memory
        resources = container_resources(spec, cpu, memory)
        name = workload_name(self.job, role)
        if obj["kind"] == "StatefulSet":  # a template change = a rolling update of the pods
            patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/resources", "value": resources}]
            self.cluster.apps.patch_namespaced_stateful_set(name, self.ns, patch, **JSON_PATCH)
        elif obj["kind"] == "Job":
            recreate_trainer(self, obj, cpu=cpu, memory=memory)
        else:
            group, version, plural = PYTORCHJOB
            patch = [
                {
                    "op": "replace",
                    "path": f"/spec/pytorchReplicaSpecs/{kind}/template/spec/containers/0/resources",
                    "value": resources,
                }
                for kind in obj["spec"]["pytorchReplicaSpecs"]
            ]
            self.cluster.custom.patch_namespaced_custom_object(
                group, version, self.ns, plural, name, patch, **JSON_PATCH
            )
        self.patch_cr_role(role, {"cpu": cpu, "memory": memory})

    def _delete_workloads(self, keep_trainer: bool = False) -> None:
        from kubernetes.client.rest import ApiException

        for role in self.roles():
            if keep_trainer and role == role_rules.TRAINER_ROLE:
                continue
            name = workload_name(self.job, role)
            try:
                if role != role_rules.TRAINER_ROLE:
                    self.cluster.apps.delete_namespaced_stateful_set(name, self.ns)
                elif self.trainer_kind() == "pytorchjob":
                    group, version, plural = PYTORCHJOB
                    self.cluster.custom.delete_namespaced_custom_object(group, version, self.ns, plural, name)
                else:
                    self.cluster.batch.delete_namespaced_job(name, self.ns, propagation_policy="Background")
            except ApiException as exc:
                if not _not_found(exc):
                    raise

    def stop(self) -> None:
        from kubernetes.client.rest import ApiException

        self._delete_workloads()
        for delete, name in (
            (self.cluster.core.delete_namespaced_service, trainer_service_name(self.job)),
            (self.cluster.core.delete_namespaced_service, executor_service_name(self.job)),
            (self.cluster.networking.delete_namespaced_network_policy, executor_service_name(self.job)),
            (self.cluster.networking.delete_namespaced_network_policy, trainer_service_name(self.job)),
            (self.cluster.core.delete_namespaced_config_map, spec_configmap_name(self.job)),
        ):
            try:
                delete(name, self.ns)
            except ApiException as exc:
                if not _not_found(exc):
                    raise
        if self.get_cr() is not None:
            self.set_cr_status(JobStatus(self.job.name, "Stopped", {}, "stopped by the controller"))
