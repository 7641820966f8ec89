"""How idle a Kubernetes cluster is, for multi-cluster placement.

capacity  = the sum of node allocatable when the controller may list nodes and nodes exist,
            else the ``primus-capacity`` ConfigMap of the target namespace (data: cpu, memory as
            Kubernetes quantities) - what an operator declares as this job's share of the cluster;
requested = requests of the namespace's live pods that Primus did not create (other tenants), plus
            replicas x requests of Primus's own workloads (counted from the workload objects, so a
            cluster without controllers - or with pods not yet created - is still accounted).
Only the target namespace is counted (least privilege: the controller may list pods there only).
ResourceQuota status is not used: it needs the quota controller, which the test apiserver lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from primus_lib.resources.kubernetes import manifests as m
from primus_lib.resources.kubernetes.cluster import Cluster
from primus_lib.spec.units import parse_quantity

CAPACITY_CONFIGMAP = "primus-capacity"


@dataclass(frozen=True)
class Capacity:
    cpu_total: float
    memory_total: float
    cpu_requested: float
    memory_requested: float
    source: str

    @property
    def free_cpu(self) -> float:
        return self.cpu_total - self.cpu_requested

    @property
    def free_memory(self) -> float:
        return self.memory_total - self.memory_requested

    @property
    def idleness(self) -> float:
        """The smaller free share of CPU and memory (0 = full, 1 = empty)."""
        if self.cpu_total <= 0 or self.memory_total <= 0:
            return 0.0
        return min(self.free_cpu / self.cpu_total, self.free_memory / self.memory_total)

    def fits(self, cpu: float, memory: float) -> bool:
        return self.free_cpu >= cpu and self.free_memory >= memory


def _requests(containers: list) -> tuple[float, float]:
    cpu = memory = 0.0
    for container in containers:
        requests = (container.get("resources") or {}).get("requests") or {}
        cpu += parse_quantity(requests.get("cpu", 0))
        memory += parse_quantity(requests.get("memory", 0))
    return cpu, memory


def _total(cluster: Cluster) -> tuple[float, float, str] | None:
    from kubernetes.client.rest import ApiException

    try:
        nodes = cluster.core.list_node().items
    except ApiException:
        nodes = []
    if nodes:
        cpu = sum(parse_quantity((n.status.allocatable or {}).get("cpu", 0)) for n in nodes)
        memory = sum(parse_quantity((n.status.allocatable or {}).get("memory", 0)) for n in nodes)
        return cpu, memory, "nodes"
    try:
        data = cluster.core.read_namespaced_config_map(CAPACITY_CONFIGMAP, cluster.namespace).data or {}
    except ApiException:
        return None
    try:
        return parse_quantity(data["cpu"]), parse_quantity(data["memory"]), f"configmap/{CAPACITY_CONFIGMAP}"
    except (KeyError, ValueError) as exc:
        raise ValueError(
            f"cluster {cluster.name!r}: ConfigMap {cluster.namespace}/{CAPACITY_CONFIGMAP} needs data.cpu and "
            f"data.memory as quantities (e.g. '64', '256Gi'): {exc}"
        ) from exc


def capacity(cluster: Cluster) -> Capacity | None:
    """The cluster's capacity and what is requested in the target namespace; None if unknown."""
    total = _total(cluster)
    if total is None:
        return None
    ser = cluster.api.sanitize_for_serialization
    cpu = memory = 0.0
    for pod in cluster.core.list_namespaced_pod(cluster.namespace).items:
        if m.JOB_LABEL in (pod.metadata.labels or {}) or pod.status.phase in ("Succeeded", "Failed"):
            continue
        c, mem = _requests(ser(pod.spec).get("containers", []))
        cpu, memory = cpu + c, memory + mem
    selector = "app.kubernetes.io/managed-by=primus-controller"
    for sts in cluster.apps.list_namespaced_stateful_set(cluster.namespace, label_selector=selector).items:
        c, mem = _requests(ser(sts.spec.template.spec).get("containers", []))
        cpu, memory = cpu + c * (sts.spec.replicas or 0), memory + mem * (sts.spec.replicas or 0)
    for job in cluster.batch.list_namespaced_job(cluster.namespace, label_selector=selector).items:
        if (job.status.succeeded or 0) >= (job.spec.completions or 1):
            continue
        c, mem = _requests(ser(job.spec.template.spec).get("containers", []))
        cpu, memory = cpu + c * (job.spec.parallelism or 0), memory + mem * (job.spec.parallelism or 0)
    return Capacity(total[0], total[1], cpu, memory, total[2])
