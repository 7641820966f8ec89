"""A role's state on Kubernetes, read from its workload (StatefulSet, Job or PyTorchJob) and its pods:
what ``KubernetesBackend.role_status`` answers, and through it ``status()`` and the start order.

Kept apart from the backend's actions (create, scale, resize, stop): reading follows the controllers'
own records (Ready condition, restart counts, the Job's failed count, the scheduler's reason for a
Pending pod) and changes nothing.
"""

from __future__ import annotations

from primus_lib.resources.base import RoleStatus
from primus_lib.spec.units import parse_quantity


def _condition(pod, kind: str) -> str | None:
    return next((c.status for c in pod.status.conditions or [] if c.type == kind), None)


def _unschedulable(pod) -> str:
    """The scheduler's reason when it found no node for the pod ("0/2 nodes are available: ..."), else ""."""
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return c.message or "Unschedulable"
    return ""


def read_role_status(backend, role: str) -> RoleStatus:
    """``backend``: the KubernetesBackend; the role's desired, running, restarted, failed and succeeded
    counts and its allotment, read from its workload and its pods."""
    spec = backend.job.spec.resources.roles[role]
    status = RoleStatus(role, desired=spec.replicas, cpu=spec.cpu, memory=spec.memory, cluster=backend.cluster.name)
    if not backend.runnable(role):
        status.note = "not run by the backend: no command and no runnable default (Airflow mapped tasks)"
        return status
    obj = backend.read_workload(role)
    if obj is None:
        return status
    status.started = True
    kind, body, st = obj["kind"], obj["spec"], obj.get("status") or {}
    if kind == "StatefulSet":
        status.desired = body["replicas"]
        container = body["template"]["spec"]["containers"][0]
    elif kind == "Job":
        status.desired, status.succeeded = body["parallelism"], st.get("succeeded", 0)
        container = body["template"]["spec"]["containers"][0]
    else:  # PyTorchJob
        specs = body["pytorchReplicaSpecs"]
        status.desired = sum(s["replicas"] for s in specs.values())
        container = specs["Master"]["template"]["spec"]["containers"][0]
    requests = container.get("resources", {}).get("requests", {})
    status.cpu = parse_quantity(requests.get("cpu", spec.cpu))
    status.memory = parse_quantity(requests.get("memory", spec.memory))
    pods = [p for p in backend.pods(role) if p.metadata.deletion_timestamp is None]
    # running = pods a node runs and reports Ready (kubelet; kwok in the tests)
    status.running = sum(1 for p in pods if p.status.phase == "Running" and _condition(p, "Ready") == "True")
    status.restarts = max([sum(cs.restart_count for cs in (p.status.container_statuses or [])) for p in pods] or [0])
    if kind == "Job":  # each failed pod was replaced by the Job controller (until backoffLimit: Failed below)
        status.restarts = max(status.restarts, st.get("failed", 0))
    unschedulable = [p for p in pods if p.status.phase == "Pending" and _unschedulable(p)]
    if unschedulable:
        reason = _unschedulable(unschedulable[0])
        status.note = f"{len(unschedulable)} pod(s) Pending, unschedulable: {reason}"
    if kind == "StatefulSet" and status.restarts > spec.max_restarts:
        status.failed = 1
        status.note = f"a pod restarted {status.restarts} times (> max_restarts {spec.max_restarts})"
    conditions = {c["type"]: c["status"] for c in st.get("conditions") or []}
    if conditions.get("Failed") == "True":
        status.failed = max(status.failed, 1)
        status.note = "the trainer job failed (backoffLimit reached)"
    if conditions.get("Complete") == "True" or conditions.get("Succeeded") == "True":
        status.succeeded = max(status.succeeded, status.desired)
    return status
