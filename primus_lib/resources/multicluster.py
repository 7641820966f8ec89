"""Several clusters at once: each role goes to the idlest cluster that fits it, and a cluster that
gets busy gets resources back (its elastic roles shrink toward min_replicas).

Kubernetes clusters are measured from their nodes and pods (kubernetes/capacity.py): a role fits
when each of its pods fits on some schedulable node; YARN clusters from the RM's queue totals.

The placement (role -> cluster) is kept in JobPaths(...).root/resources/placement.json so another
process reattaches to the same clusters.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeAlias

from primus_lib.resources import roles as role_rules
from primus_lib.resources.base import JobStatus, ResourceBackend, ResourceError, RoleStatus
from primus_lib.resources.table import locked, read_json, resources_dir, write_json
from primus_lib.spec.job import PrimusJob

if TYPE_CHECKING:
    from primus_lib.resources.kubernetes.backend import KubernetesBackend
    from primus_lib.resources.yarn import YarnBackend

    Member: TypeAlias = KubernetesBackend | YarnBackend  # a Kubernetes member has .cluster, a YARN one .idleness()

BUSY_IDLENESS = 0.10  # a cluster with less than 10% free CPU or memory is busy


class MultiClusterBackend(ResourceBackend):
    name = "multicluster"

    def __init__(self, job: PrimusJob, spec_path: str | None = None, members: dict[str, Member] | None = None) -> None:
        super().__init__(job, spec_path)
        self.members = members if members is not None else self._members()
        for member in self.members.values():
            member.only = set()
        self._apply_placement()

    def _members(self) -> dict[str, Member]:
        out: dict[str, Member] = {}
        for target in self.job.spec.resources.clusters:
            if target.backend == "kubernetes":
                from primus_lib.resources.kubernetes.backend import KubernetesBackend
                from primus_lib.resources.kubernetes.cluster import Cluster, api_client_for

                cluster = Cluster(api_client_for(target.kubeconfig, target.context), target.namespace, target.name)
                out[target.name] = KubernetesBackend(self.job, self.spec_path, cluster=cluster, roles=())
            else:
                from primus_lib.resources.yarn import YarnBackend

                out[target.name] = YarnBackend(self.job, self.spec_path, target=target, roles=())
        return out

    # -- placement --------------------------------------------------------------------------
    @property
    def _file(self):
        return resources_dir(self.job) / "placement.json"

    def placement(self) -> dict[str, str]:
        return read_json(self._file, {})

    def _apply_placement(self) -> None:
        placed = self.placement()
        for name, member in self.members.items():
            member.only = {role for role, where in placed.items() if where == name}

    def capacity(self, name: str):
        """A Kubernetes member's Capacity (nodes and pods, primus_lib/resources/kubernetes/capacity.py)."""
        from primus_lib.resources.kubernetes.capacity import capacity

        member = self.members[name]
        if not hasattr(member, "cluster"):
            raise ResourceError(f"cluster {name!r} is not Kubernetes: its capacity is its YARN queue's (idleness)")
        return capacity(member.cluster)

    def idleness(self, name: str) -> tuple[float, float, float, float]:
        """(free share, free cores, free bytes, total cores) of one cluster."""
        member = self.members[name]
        if hasattr(member, "cluster"):
            cap = self.capacity(name)
            return cap.idleness, cap.free_cpu, cap.free_memory, cap.cpu_total
        return member.idleness()

    def _fits(self, name: str, cpu: float, memory: float, replicas: int) -> tuple[bool, float, str]:
        """(all replicas fit, free share, a description of what is free) for one cluster."""
        if hasattr(self.members[name], "cluster"):  # Kubernetes: each pod must fit on one node
            cap = self.capacity(name)
            biggest = max(cap.nodes, key=lambda n: n.free_cpu, default=None)
            room = f"{cap.free_cpu:g} cores, {cap.free_memory / 2**30:.1f} GiB free on {len(cap.nodes)} nodes" + (
                f" (at most {biggest.free_cpu:g} cores on one)" if biggest else f" ({cap.source})"
            )
            return cap.fits(cpu, memory, replicas), cap.idleness, room
        share, free_cpu, free_mem, _ = self.idleness(name)  # YARN: the queue's totals
        fits = free_cpu >= cpu * replicas and free_mem >= memory * replicas
        return fits, share, f"{free_cpu:g} cores, {free_mem / 2**30:.1f} GiB free"

    def place(self, role: str) -> str:
        """The idlest cluster where all of the role's replicas fit (on Kubernetes: pod by pod on its nodes)."""
        spec = self.job.spec.resources.roles[role]
        options, rooms = [], {}
        for name in self.members:
            fits, share, rooms[name] = self._fits(name, spec.cpu, spec.memory, spec.replicas)
            if fits:
                options.append((share, name))
        if not options:
            raise ResourceError(
                f"job {self.job.name!r}: role {role!r} needs {spec.replicas} x {spec.cpu:g} cores / "
                f"{spec.memory / 2**30:.1f} GiB; no cluster fits that: "
                + "; ".join(f"{n}: {room}" for n, room in rooms.items())
            )
        options.sort(reverse=True)
        return options[0][1]

    def _where(self, role: str) -> Member:
        placed = self.placement()
        if role not in placed:
            raise ResourceError(f"job {self.job.name!r}: role {role!r} is not placed on any cluster yet")
        return self.members[placed[role]]

    # -- the interface ----------------------------------------------------------------------
    def _role_status(self, role: str) -> RoleStatus:
        placed = self.placement()
        if role not in placed:
            spec = self.job.spec.resources.roles[role]
            return RoleStatus(role, desired=spec.replicas, cpu=spec.cpu, memory=spec.memory)
        status = self.members[placed[role]].role_status(role)
        status.cluster = placed[role]
        return status

    def submit(self) -> JobStatus:
        with locked(resources_dir(self.job)):
            placed = self.placement()
            for wave in role_rules.start_order(self.job):
                for role in wave:
                    member_has_cmd = any(getattr(mb, "runnable", lambda r: True)(role) for mb in self.members.values())
                    if role in placed or not member_has_cmd:
                        continue
                    placed[role] = self.place(role)
                    write_json(self._file, placed)
                    self._apply_placement()
                    self.members[placed[role]].create_role(role)
                if not all(self._ready(r) for r in wave):
                    break
        return self.status()

    def _ready(self, role: str) -> bool:
        placed = self.placement()
        if role not in placed:
            return True  # not run by any backend (e.g. batch executors: Airflow mapped tasks)
        member = self.members[placed[role]]
        status = member.role_status(role)
        if hasattr(member, "role_ready"):
            return member.role_ready(status)
        return status.running >= status.desired

    def ensure_running(self) -> JobStatus:
        current = self.status()
        if current.phase in ("Succeeded", "Failed"):
            return current
        return self.submit()

    def status(self) -> JobStatus:
        roles = {r: self._role_status(r) for r in self.job.spec.resources.roles}
        for name, r in roles.items():
            if r.failed and role_rules.is_critical(self.job, name):
                return JobStatus(self.job.name, "Failed", roles, f"critical role {name!r} failed on {r.cluster}")
        trainer = roles.get(role_rules.TRAINER_ROLE)
        if trainer and trainer.started and trainer.succeeded >= trainer.desired > 0:
            return JobStatus(self.job.name, "Succeeded", roles)
        if not any(r.started for r in roles.values()):
            return JobStatus(self.job.name, "Stopped", roles, "nothing placed")
        placed = self.placement()
        pending = [r for r in placed if not roles[r].started]
        return JobStatus(self.job.name, "Pending" if pending else "Running", roles)

    def scale(self, role: str, replicas: int) -> None:
        self._where(role).scale(role, replicas)

    def resize(self, role: str, cpu: float | None = None, memory: float | None = None) -> None:
        self._where(role).resize(role, cpu, memory)

    def stop(self) -> None:
        for member in self.members.values():
            if member.only:
                member.stop()

    def rebalance(self) -> list[dict]:
        """Give resources back on busy clusters: shrink elastic roles there toward min_replicas,
        just enough to bring the cluster back above BUSY_IDLENESS. Returns the changes made."""
        changes = []
        placed = self.placement()
        for name, member in self.members.items():
            kube = hasattr(member, "cluster")
            if kube:
                cap = self.capacity(name)
                share, free_cpu, free_mem = cap.idleness, cap.free_cpu, cap.free_memory
                total_cpu, total_mem = cap.cpu_total, cap.memory_total
            else:
                share, free_cpu, free_mem, total_cpu = self.idleness(name)
                total_mem = 0.0  # YARN's tuple has no total memory: CPU decides, then the RM is asked again
            if share >= BUSY_IDLENESS:
                continue
            for role in [r for r, where in placed.items() if where == name]:
                spec = self.job.spec.resources.roles[role]
                current = member.role_status(role).desired
                if current <= spec.min_count:
                    continue
                release = 1 if total_cpu else current - spec.min_count
                if total_cpu and spec.cpu > 0:
                    release = max(release, math.ceil((BUSY_IDLENESS * total_cpu - free_cpu) / spec.cpu - 1e-9))
                if total_mem and spec.memory > 0:
                    release = max(release, math.ceil((BUSY_IDLENESS * total_mem - free_mem) / spec.memory - 1e-9))
                target = max(spec.min_count, current - release)
                member.scale(role, target)
                changes.append({"cluster": name, "role": role, "from": current, "to": target, "idleness": share})
                if kube:  # the controller deletes the released pods a moment later: count them free now
                    free_cpu += (current - target) * spec.cpu
                    free_mem += (current - target) * spec.memory
                    share = min(free_cpu / total_cpu, free_mem / total_mem) if total_cpu and total_mem else 0.0
                else:
                    share, free_cpu, free_mem, total_cpu = self.idleness(name)
                if share >= BUSY_IDLENESS:
                    break
        return changes
