"""The YARN backend: a client of the ResourceManager REST API (Hadoop 3 /ws/v1/cluster).

Not run against a real YARN here (no ResourceManager can be installed on these machines);
tests check the requests it builds against a fake HTTP layer. Each worker of a role is one YARN
application whose AM container runs the role's command (tags primus-job:<job>, primus-role:<role>);
failover = YARN's own AM attempts (max-app-attempts = max_restarts + 1); scale submits or kills
applications; resize kills and resubmits them with the new resource (a rolling restart).
"""

from __future__ import annotations

import math
import shlex

import requests

from primus_lib.resources import roles as role_rules
from primus_lib.resources.base import JobStatus, ResourceBackend, ResourceError, RoleStatus
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.resources import ClusterTarget

APP_TYPE = "PRIMUS"
LIVE_STATES = ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED", "RUNNING")
MIB = 2**20


class YarnClient:
    """The few ResourceManager REST calls the backend needs."""

    def __init__(
        self, url: str, session: requests.Session | None = None, timeout: float = 30.0, user: str | None = None
    ):
        self.url, self.timeout, self.user = url.rstrip("/"), timeout, user
        self.session = session or requests.Session()

    def _call(self, method: str, path: str, **kwargs) -> dict:
        params = kwargs.pop("params", {}) or {}
        if self.user:
            params["user.name"] = self.user
        reply = self.session.request(method, f"{self.url}/ws/v1/cluster{path}", params=params, timeout=self.timeout,
                                     headers={"Accept": "application/json"}, **kwargs)  # fmt: skip
        if reply.status_code >= 400:
            raise ResourceError(f"YARN RM {self.url}: {method} {path} answered {reply.status_code}: {reply.text[:300]}")
        return reply.json() if reply.content else {}

    def new_application(self) -> str:
        return self._call("POST", "/apps/new-application")["application-id"]

    def submit(self, context: dict) -> None:
        self._call("POST", "/apps", json=context)

    def apps(self, tags: list[str]) -> list[dict]:
        body = self._call("GET", "/apps", params={"applicationTags": ",".join(tags), "applicationTypes": APP_TYPE})
        return ((body.get("apps") or {}).get("app")) or []

    def kill(self, app_id: str) -> None:
        self._call("PUT", f"/apps/{app_id}/state", json={"state": "KILLED"})

    def metrics(self) -> dict:
        return self._call("GET", "/metrics")["clusterMetrics"]


def submission_context(app_id: str, name: str, command: list[str], cpu: float, memory: float, queue: str,
                       tags: list[str], env: dict[str, str], attempts: int) -> dict:  # fmt: skip
    """The application-submission-context of the RM REST API (Cluster Applications API)."""
    return {
        "application-id": app_id, "application-name": name, "application-type": APP_TYPE, "queue": queue,
        "am-container-spec": {
            "commands": {"command": shlex.join(command) + " 1><LOG_DIR>/stdout 2><LOG_DIR>/stderr"},
            "environment": {"entry": [{"key": k, "value": v} for k, v in sorted(env.items())]},
        },
        "resource": {"memory": int(math.ceil(memory / MIB)), "vCores": max(1, int(math.ceil(cpu)))},
        "max-app-attempts": attempts, "keep-containers-across-application-attempts": False,
        "unmanaged-AM": False, "application-tags": {"tag": tags},
    }  # fmt: skip


class YarnBackend(ResourceBackend):
    name = "yarn"

    def __init__(self, job: PrimusJob, spec_path: str | None = None, target: ClusterTarget | None = None,
                 client: YarnClient | None = None, roles=None) -> None:  # fmt: skip
        super().__init__(job, spec_path)
        target = target or next((c for c in job.spec.resources.clusters if c.backend == "yarn"), None)
        if client is None and (target is None or not target.resource_manager):
            raise ResourceError(f"job {job.name!r}: the yarn backend needs a cluster with resource_manager")
        self.target = target
        self.queue = target.queue if target else "default"
        self.client = client or YarnClient(target.resource_manager)
        self.only = set(roles) if roles is not None else None
        self._sizes: dict[str, tuple[float, float]] = {}

    def roles(self) -> list[str]:
        return [r for r in self.job.spec.resources.roles if self.only is None or r in self.only]

    def tags(self, role: str | None = None) -> list[str]:
        tags = [f"primus-job:{self.job.name}"]
        return tags + [f"primus-role:{role}"] if role else tags

    def live(self, role: str) -> list[dict]:
        apps = [a for a in self.client.apps(self.tags(role)) if a.get("state") in LIVE_STATES]
        return sorted(apps, key=lambda a: a.get("name", ""))

    def _start_worker(self, role: str, index: int) -> None:
        spec = self.job.spec.resources.roles[role]
        command = role_rules.command_for(self.job, role, self.spec_path)
        if command is None:
            return
        cpu, memory = self._sizes.get(role, (spec.cpu, spec.memory))
        env = {"PRIMUS_JOB": self.job.name, "PRIMUS_ROLE": role, "PRIMUS_REPLICA_INDEX": str(index)}
        app_id = self.client.new_application()
        self.client.submit(submission_context(app_id, f"{self.job.name}-{role}-{index}", command, cpu, memory,
                                              self.queue, self.tags(role), env, spec.max_restarts + 1))  # fmt: skip

    def create_role(self, role: str) -> None:
        spec = self.job.spec.resources.roles[role]
        running = len(self.live(role))
        for index in range(running, spec.replicas):
            self._start_worker(role, index)

    def role_ready(self, status: RoleStatus) -> bool:
        return status.running >= status.desired

    def role_status(self, role: str) -> RoleStatus:
        spec = self.job.spec.resources.roles[role]
        apps = self.client.apps(self.tags(role))
        cpu, memory = self._sizes.get(role, (spec.cpu, spec.memory))
        status = RoleStatus(
            role, desired=spec.replicas, cpu=cpu, memory=memory, cluster=self.target.name if self.target else None
        )
        status.running = sum(a.get("state") == "RUNNING" for a in apps)
        status.succeeded = sum(a.get("finalStatus") == "SUCCEEDED" for a in apps)
        status.failed = sum(a.get("finalStatus") == "FAILED" for a in apps)
        status.started = bool(apps)
        return status

    def submit(self) -> JobStatus:
        for wave in role_rules.start_order(self.job):
            for role in wave:
                if role in self.roles():
                    self.create_role(role)
        return self.status()

    def status(self) -> JobStatus:
        roles = {r: self.role_status(r) for r in self.roles()}
        for name, r in roles.items():
            if r.failed and role_rules.is_critical(self.job, name):
                return JobStatus(self.job.name, "Failed", roles, f"critical role {name!r}: an application FAILED")
        trainer = roles.get(role_rules.TRAINER_ROLE)
        if trainer and trainer.succeeded >= trainer.desired > 0:
            return JobStatus(self.job.name, "Succeeded", roles)
        if not any(r.started for r in roles.values()):
            return JobStatus(self.job.name, "Stopped", roles, "no applications")
        if not any(self.live(r) for r in roles):
            return JobStatus(self.job.name, "Stopped", roles, "no live applications")
        return JobStatus(self.job.name, "Running" if any(r.running for r in roles.values()) else "Pending", roles)

    def scale(self, role: str, replicas: int) -> None:
        n = self.check_replicas(role, replicas)
        live = self.live(role)
        for app in live[n:]:
            self.client.kill(app["id"])
        for index in range(len(live), n):
            self._start_worker(role, index)

    def resize(self, role: str, cpu: float | None = None, memory: float | None = None) -> None:
        spec = self.role_spec(role)
        old = self._sizes.get(role, (spec.cpu, spec.memory))
        self._sizes[role] = (cpu or old[0], memory or old[1])
        for index, app in enumerate(self.live(role)):  # rolling: one worker at a time
            self.client.kill(app["id"])
            self._start_worker(role, index)

    def stop(self) -> None:
        for role in self.roles():
            for app in self.live(role):
                self.client.kill(app["id"])

    def idleness(self) -> tuple[float, float, float, float]:
        """(free share, free cores, free bytes, total cores) from the RM's cluster metrics."""
        metrics = self.client.metrics()
        cores, total_cores = float(metrics["availableVirtualCores"]), float(metrics["totalVirtualCores"] or 1)
        mem, total_mem = float(metrics["availableMB"]), float(metrics["totalMB"] or 1)
        return min(cores / total_cores, mem / total_mem), cores, mem * MIB, total_cores
