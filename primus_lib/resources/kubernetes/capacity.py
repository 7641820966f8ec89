"""How idle a Kubernetes cluster is, for multi-cluster placement: read from its nodes and pods.

- nodes: the Ready, schedulable nodes (not cordoned, no NoSchedule/NoExecute taint - Primus's pods
  tolerate none) and their ``allocatable`` CPU, memory and pod count;
- used: per node, the requests of the pods bound to it (``spec.nodeName``) that have not ended,
  in every namespace - what the scheduler itself subtracts from allocatable;
- Primus's own pods the scheduler has not bound yet (replicas that its StatefulSets/Jobs in the
  target namespace ask for beyond their bound pods) are placed on paper, each on the node with the
  most free CPU that fits it, so a role placed a moment ago counts before its pods are bound. Other
  tenants' Pending pods are not counted: they hold nothing until bound.

idleness = min(free CPU share, free memory share) over those nodes; ``fits(cpu, memory, n)`` asks
whether n pods of that size fit the nodes one by one (a pod lives on one node). Needs ``list`` on
nodes and pods cluster-wide (config/rbac/cluster-role.yaml); without the cluster-wide pod list only
the target namespace's pods are counted, and ``source`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from primus_lib.resources.kubernetes.cluster import Cluster
from primus_lib.resources.kubernetes.names import JOB_LABEL, PYTORCHJOB, ROLE_LABEL
from primus_lib.spec.units import parse_quantity

ENDED = ("Succeeded", "Failed")
BLOCKING_TAINTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class NodeRoom:
    """One schedulable node: allocatable and what the pods bound to it request."""

    name: str
    cpu: float
    memory: float
    pods: int
    cpu_used: float = 0.0
    memory_used: float = 0.0
    pods_used: int = 0

    @property
    def free_cpu(self) -> float:
        return self.cpu - self.cpu_used

    @property
    def free_memory(self) -> float:
        return self.memory - self.memory_used

    def slots(self, cpu: float, memory: float) -> int:
        """How many more pods requesting ``cpu`` cores and ``memory`` bytes fit here."""
        n = self.pods - self.pods_used
        if cpu > 0:
            n = min(n, int(self.free_cpu / cpu + 1e-9))
        if memory > 0:
            n = min(n, int(self.free_memory / memory + 1e-9))
        return max(0, n)

    def take(self, cpu: float, memory: float) -> NodeRoom:
        return replace(
            self, cpu_used=self.cpu_used + cpu, memory_used=self.memory_used + memory, pods_used=self.pods_used + 1
        )


@dataclass(frozen=True)
class Capacity:
    cpu_total: float
    memory_total: float
    cpu_requested: float
    memory_requested: float
    source: str
    nodes: tuple[NodeRoom, ...] = field(default_factory=tuple)
    unplaced: int = 0  # Primus's own unbound pods that fit no node (they stay Pending)

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
        return max(0.0, min(self.free_cpu / self.cpu_total, self.free_memory / self.memory_total))

    def fits(self, cpu: float, memory: float, replicas: int = 1) -> bool:
        """Whether ``replicas`` pods of this size fit on the nodes, each on one node."""
        return sum(node.slots(cpu, memory) for node in self.nodes) >= replicas


def pod_requests(spec: dict) -> tuple[float, float]:
    """(cores, bytes) a pod spec requests, as the scheduler counts it: the sum over its containers,
    at least the largest init container, plus the pod overhead."""

    def amounts(container: dict) -> tuple[float, float]:
        requests = (container.get("resources") or {}).get("requests") or {}
        return parse_quantity(requests.get("cpu", 0)), parse_quantity(requests.get("memory", 0))

    cpu = memory = 0.0
    for container in spec.get("containers") or []:
        c, mem = amounts(container)
        cpu, memory = cpu + c, memory + mem
    for container in spec.get("initContainers") or []:
        c, mem = amounts(container)
        cpu, memory = max(cpu, c), max(memory, mem)
    overhead = spec.get("overhead") or {}
    return cpu + parse_quantity(overhead.get("cpu", 0)), memory + parse_quantity(overhead.get("memory", 0))


def _schedulable(node) -> bool:
    if node.spec.unschedulable:
        return False
    if any(t.effect in BLOCKING_TAINTS for t in node.spec.taints or []):
        return False
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _own_unbound(cluster: Cluster, bound: dict[tuple[str, str], int]) -> list[tuple[float, float]]:
    """Requests of the pods Primus's workloads in the namespace want but the scheduler has not bound."""
    ser = cluster.api.sanitize_for_serialization
    selector = "app.kubernetes.io/managed-by=primus-controller"
    wanted: list[tuple[dict, int, dict]] = []  # (labels, replicas, pod spec)
    for sts in cluster.apps.list_namespaced_stateful_set(cluster.namespace, label_selector=selector).items:
        wanted.append((sts.metadata.labels or {}, sts.spec.replicas or 0, ser(sts.spec.template.spec)))
    for job in cluster.batch.list_namespaced_job(cluster.namespace, label_selector=selector).items:
        left = (job.spec.completions or 1) - (job.status.succeeded or 0)
        if any(c.type in ("Complete", "Failed") and c.status == "True" for c in job.status.conditions or []):
            left = 0
        wanted.append(
            (job.metadata.labels or {}, max(0, min(job.spec.parallelism or 0, left)), ser(job.spec.template.spec))
        )
    if cluster.has_pytorchjob:
        group, version, plural = PYTORCHJOB
        jobs = cluster.custom.list_namespaced_custom_object(
            group, version, cluster.namespace, plural, label_selector=selector
        )
        for obj in jobs.get("items", []):
            for replica in (obj.get("spec") or {}).get("pytorchReplicaSpecs", {}).values():
                labels = (obj.get("metadata") or {}).get("labels") or {}
                wanted.append((labels, replica.get("replicas", 0), replica["template"]["spec"]))
    out = []
    for labels, replicas, spec in wanted:
        key = (labels.get(JOB_LABEL, ""), labels.get(ROLE_LABEL, ""))
        have = bound.get(key, 0)
        bound[key] = max(0, have - replicas)  # two PyTorchJob replica types share one role label
        out += [pod_requests(spec)] * max(0, replicas - have)
    return out


def capacity(cluster: Cluster) -> Capacity:
    """The cluster's schedulable allocatable and what is requested on it (see the module doc)."""
    from kubernetes.client.rest import ApiException

    try:
        all_nodes = cluster.core.list_node().items
    except ApiException as exc:
        return Capacity(0, 0, 0, 0, f"unknown: nodes cannot be listed ({exc.status} {exc.reason})")
    rooms: dict[str, NodeRoom] = {}
    for node in all_nodes:
        if _schedulable(node):
            alloc = node.status.allocatable or {}
            rooms[node.metadata.name] = NodeRoom(
                node.metadata.name,
                parse_quantity(alloc.get("cpu", 0)),
                parse_quantity(alloc.get("memory", 0)),
                int(parse_quantity(alloc.get("pods", 110))),
            )
    source = f"{len(rooms)} of {len(all_nodes)} nodes schedulable; pods of all namespaces"
    try:
        pods = cluster.core.list_pod_for_all_namespaces().items
    except ApiException as exc:
        if exc.status != 403:
            raise
        pods = cluster.core.list_namespaced_pod(cluster.namespace).items
        source = (
            f"{len(rooms)} of {len(all_nodes)} nodes schedulable; pods of namespace {cluster.namespace} only "
            "(no cluster-wide pod list)"
        )
    ser = cluster.api.sanitize_for_serialization
    bound: dict[tuple[str, str], int] = {}
    for pod in pods:
        node = pod.spec.node_name
        if not node or pod.status.phase in ENDED:
            continue
        if node in rooms:
            rooms[node] = rooms[node].take(*pod_requests(ser(pod.spec)))
        labels = pod.metadata.labels or {}
        if pod.metadata.namespace == cluster.namespace and JOB_LABEL in labels:
            key = (labels[JOB_LABEL], labels.get(ROLE_LABEL, ""))
            bound[key] = bound.get(key, 0) + 1
    unplaced = 0
    for cpu, memory in _own_unbound(cluster, bound):
        fitting = [r for r in rooms.values() if r.slots(cpu, memory) > 0]
        if not fitting:
            unplaced += 1
            continue
        best = max(fitting, key=lambda r: (r.free_cpu, r.free_memory))
        rooms[best.name] = best.take(cpu, memory)
    nodes = tuple(rooms.values())
    return Capacity(
        cpu_total=sum(r.cpu for r in nodes),
        memory_total=sum(r.memory for r in nodes),
        cpu_requested=sum(r.cpu_used for r in nodes),
        memory_requested=sum(r.memory_used for r in nodes),
        source=source,
        nodes=nodes,
        unplaced=unplaced,
    )
