"""The YARN backend: each worker of a role is one YARN application whose AM container runs our AM
(primus_lib.resources.yarn.am: registers with the RM, heartbeats, runs the role's command).

- tags: primus-job:<job>, primus-role:<role>, primus-worker:<index> (the RM lowercases tags and
  matches ANY of the tags asked for, so the backend asks for the job tag and filters the rest);
- restarts: YARN's AM retry (max-app-attempts = max_restarts + 1, capped by the RM's
  yarn.resourcemanager.am.max-attempts); past the cap the backend resubmits a FAILED worker while
  the role's restart budget lasts. restarts = attempts beyond the first + FAILED applications
  replaced by a new one, read from the RM (any process sees the same count);
- scale submits / kills applications; resize kills and resubmits them one by one with the new
  resource (an AM container cannot be resized in place);
- a stream executor's default command is ``primus executor SPEC --index I --replicas N`` bound to
  every address on a free port; it announces itself under the job's shared state;
- desired replicas / size after scale or resize are kept in resources/yarn.json (like
  placement.json): the RM keeps no such record;
- the job's connections reach the workers as a LocalResource staged on the cluster's HDFS
  (staging.py), never as the caller's PRIMUS_SECRETS_DIR (a path on the submitting host).
"""

from __future__ import annotations

import re
import sys
import time

from primus_lib.resources import roles as role_rules
from primus_lib.resources.base import JobStatus, ResourceBackend, ResourceError, RoleStatus
from primus_lib.resources.table import locked, read_json, resources_dir, write_json
from primus_lib.resources.yarn.client import LIVE_STATES, MIB, YarnClient, submission_context
from primus_lib.resources.yarn.staging import JobSecrets, worker_environment
from primus_lib.settings import child_environment
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.resources import ClusterTarget

WAVE_TIMEOUT_SECONDS = 120.0
POLL_SECONDS = 0.25
# Passed to every worker: the job's own settings (PRIMUS_HOME, PRIMUS_DATA, ...).
PASS_ENV_PREFIXES = ("PRIMUS_",)
EXECUTOR_ROLE = "stream_executor"


def _tag(kind: str, value: str | int) -> str:
    return f"primus-{kind}:{value}".lower()


def _tags(app: dict) -> dict[str, str]:
    out = {}
    for tag in (app.get("applicationTags") or "").split(","):
        key, _, value = tag.partition(":")
        out[key] = value
    return out


def _order(app: dict) -> tuple[int, int]:
    cluster, _, seq = app["id"].removeprefix("application_").partition("_")
    return int(cluster or 0), int(seq or 0)


def diagnosis(app: dict) -> str:
    """The gist of a failed application's diagnostics: the AM container's exit code and the last
    lines of its stderr (the RM's text repeats both at length)."""
    text = app.get("diagnostics") or ""
    code = re.search(r"exit(?:Code:| code)\s*(-?\d+)", text)
    tail = re.search(r"Last \d+ bytes of stderr :\n(.*?)(?:\n\n|$)", text, re.S)
    lines = [
        ln.strip()
        for ln in (tail.group(1).splitlines() if tail else [])
        if ln.strip() and not ln.startswith("primus-am: registered")
    ]
    parts = [f"exit code {code.group(1)}" if code else "", " | ".join(lines[-3:])[-300:]]
    return ": ".join(p for p in parts if p) or text.strip()[:300]


def is_live(app: dict) -> bool:
    return app.get("state") in LIVE_STATES


def is_failed(app: dict) -> bool:
    return app.get("state") == "FAILED" or app.get("finalStatus") == "FAILED"


class YarnBackend(ResourceBackend):
    name = "yarn"

    def __init__(
        self,
        job: PrimusJob,
        spec_path: str | None = None,
        target: ClusterTarget | None = None,
        client: YarnClient | None = None,
        roles=None,
    ) -> None:
        super().__init__(job, spec_path)
        target = target or next((c for c in job.spec.resources.clusters if c.backend == "yarn"), None)
        if client is None:
            if target is None or not target.resource_manager:
                raise ResourceError(f"job {job.name!r}: the yarn backend needs a cluster with resource_manager")
            client = YarnClient(target.resource_manager, user=target.user)
        self.target = target
        self.queue = target.queue if target else "default"
        self.client = client
        self.only = set(roles) if roles is not None else None
        self.python = (target.python if target else None) or sys.executable
        self._finished_attempts: dict[str, int] = {}  # attempts of finished apps never change
        self.secrets = JobSecrets(job, client)  # the job's connections, staged on the cluster's HDFS

    # -- what is wanted -------------------------------------------------------------------------
    def roles(self) -> list[str]:
        return [r for r in self.job.spec.resources.roles if self.only is None or r in self.only]

    def runnable(self, role: str) -> bool:
        return role_rules.command_for(self.job, role, self.spec_path) is not None

    @property
    def _record_file(self):
        return resources_dir(self.job) / "yarn.json"

    def desired(self, role: str) -> tuple[int, float, float]:
        """(replicas, cpu, memory) of a role: the spec, changed by scale/resize."""
        spec = self.role_spec(role)
        rec = read_json(self._record_file, {}).get(role, {})
        return (
            int(rec.get("replicas", spec.replicas)),
            float(rec.get("cpu", spec.cpu)),
            float(rec.get("memory", spec.memory)),
        )

    def _remember(self, role: str, **change) -> None:
        with locked(resources_dir(self.job)):
            record = read_json(self._record_file, {})
            record.setdefault(role, {}).update(change)
            write_json(self._record_file, record)

    # -- what runs ------------------------------------------------------------------------------
    def job_apps(self) -> list[dict]:
        return self.client.apps(_tag("job", self.job.name))

    def history(self, role: str, apps: list[dict] | None = None) -> dict[int, list[dict]]:
        """index -> the worker's applications, oldest first."""
        out: dict[int, list[dict]] = {}
        for app in sorted(self.job_apps() if apps is None else apps, key=_order):
            tags = _tags(app)
            if tags.get("primus-role") == role.lower() and tags.get("primus-worker", "").isdigit():
                out.setdefault(int(tags["primus-worker"]), []).append(app)
        return dict(sorted(out.items()))

    def attempts(self, app: dict) -> int:
        if app["id"] in self._finished_attempts:
            return self._finished_attempts[app["id"]]
        count = max(1, len(self.client.attempts(app["id"])))
        if not is_live(app):
            self._finished_attempts[app["id"]] = count
        return count

    def restarts(self, history: list[dict]) -> int:
        """Attempts beyond each application's first + FAILED applications that a newer one replaced."""
        return sum(self.attempts(a) - 1 for a in history) + sum(is_failed(a) for a in history[:-1])

    def workers(self, role: str | None = None) -> dict[str, list[dict]]:
        """Per role: one row per worker (its latest application, AM container, node, allocation)."""
        apps = self.job_apps()
        out: dict[str, list[dict]] = {}
        for name in [role] if role else self.roles():
            rows = []
            for index, history in self.history(name, apps).items():
                app = history[-1]
                attempts = self.client.attempts(app["id"])
                last = max(attempts, key=lambda a: int(a.get("id", 0)), default={})
                rows.append(
                    {
                        "index": index,
                        "app": app["id"],
                        "state": app.get("state"),
                        "final_status": app.get("finalStatus"),
                        "restarts": self.restarts(history),
                        "attempt": last.get("appAttemptId"),
                        "container": last.get("containerId"),
                        "node_http": last.get("nodeHttpAddress"),
                        "allocated_mb": app.get("allocatedMB"),
                        "allocated_vcores": app.get("allocatedVCores"),
                    }
                )
            out[name] = rows
        return out

    # -- starting and stopping workers ----------------------------------------------------------
    def _start_worker(self, role: str, index: int) -> str:
        spec = self.role_spec(role)
        command = role_rules.command_for(self.job, role, self.spec_path)
        if command is None:
            raise ResourceError(f"job {self.job.name!r} role {role!r}: no command to run")
        replicas, cpu, memory = self.desired(role)
        if role == EXECUTOR_ROLE and not spec.command:  # serve on the NodeManager's host, found through
            # the job's shared state (discovery.SharedStateDiscovery advertises the host's name)
            command += ["--index", str(index), "--replicas", str(replicas), "--host", "0.0.0.0", "--port", "0"]
        staged = self.secrets.for_worker()
        env = worker_environment(child_environment(), PASS_ENV_PREFIXES, staged)
        env.update(
            {
                "PRIMUS_JOB": self.job.name,
                "PRIMUS_ROLE": role,
                "PRIMUS_REPLICA_INDEX": str(index),
                "PRIMUS_REPLICAS": str(replicas),
                "PRIMUS_CPU": str(cpu),
                "PRIMUS_MEMORY": str(int(memory)),
            }
        )
        app_id = self.client.new_application()["application-id"]
        tags = [_tag("job", self.job.name), _tag("role", role), _tag("worker", index)]
        self.client.submit(
            submission_context(
                app_id,
                f"{self.job.name}-{role}-{index}",
                command,
                cpu,
                memory,
                self.queue,
                tags,
                env,
                spec.max_restarts + 1,
                self.python,
                scheduler=self.client.scheduler_address(),
                local_resources=[staged.local_resource()] if staged else None,
            )
        )
        return app_id

    def _kill(self, app: dict) -> None:
        try:
            self.client.kill(app["id"])
        except ResourceError:
            if is_live(self.client.app(app["id"])):
                raise  # a kill of an application that ended meanwhile is not an error

    def _wait_ended(self, app_ids: list[str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while app_ids and time.monotonic() < deadline:
            app_ids = [a for a in app_ids if is_live(self.client.app(a))]
            time.sleep(POLL_SECONDS if app_ids else 0)

    def create_role(self, role: str, apps: list[dict] | None = None) -> None:
        """Bring a role to its desired workers: start missing ones, restart FAILED ones with restarts
        left (past the RM's attempt cap), start killed ones, kill workers beyond the replicas."""
        if not self.runnable(role):
            return
        replicas = self.desired(role)[0]
        max_restarts = self.role_spec(role).max_restarts
        history = self.history(role, apps)
        for index in range(replicas):
            past = history.get(index, [])
            latest = past[-1] if past else None
            if latest is None or latest.get("state") == "KILLED":
                self._start_worker(role, index)
            elif is_failed(latest) and self.restarts(past) < max_restarts:
                self._start_worker(role, index)
        for index, past in history.items():
            if index >= replicas:
                for app in past:
                    if is_live(app):
                        self._kill(app)

    def role_ready(self, status: RoleStatus) -> bool:
        if not self.runnable(status.name):
            return True
        return status.started and status.running + status.succeeded >= status.desired

    # -- status ---------------------------------------------------------------------------------
    def role_status(self, role: str, apps: list[dict] | None = None) -> RoleStatus:
        replicas, cpu, memory = self.desired(role)
        status = RoleStatus(
            role, desired=replicas, cpu=cpu, memory=memory, cluster=self.target.name if self.target else None
        )
        if not self.runnable(role):
            status.note = "not run by the backend: no command and no runnable default (Airflow mapped tasks)"
            return status
        max_restarts = self.role_spec(role).max_restarts
        notes = []
        for index, past in self.history(role, apps).items():
            latest, restarts = past[-1], self.restarts(past)
            status.started = True
            status.restarts += restarts
            if latest.get("state") == "RUNNING":
                status.running += 1
            elif latest.get("finalStatus") == "SUCCEEDED":
                status.succeeded += 1
            elif is_failed(latest) and index < replicas:
                if restarts < max_restarts:
                    notes.append(f"worker {index} failed, restart pending (ensure_running resubmits it)")
                else:
                    status.failed += 1
                    notes.append(f"worker {index} failed after {restarts} restarts: {diagnosis(latest)}")
        status.note = "; ".join(notes)
        return status

    def status(self) -> JobStatus:
        apps = self.job_apps()
        roles = {r: self.role_status(r, apps) for r in self.roles()}
        for name, r in roles.items():
            if r.failed and role_rules.is_critical(self.job, name):
                return JobStatus(self.job.name, "Failed", roles, f"critical role {name!r} failed: {r.note}")
        trainer = roles.get(role_rules.TRAINER_ROLE)
        if trainer and trainer.started and trainer.succeeded >= trainer.desired > 0:
            return JobStatus(self.job.name, "Succeeded", roles, "every trainer worker succeeded")
        if not any(r.started for r in roles.values()):
            return JobStatus(self.job.name, "Stopped", roles, "no applications")
        mine = {r.lower() for r in roles}
        live = [a for a in apps if is_live(a) and _tags(a).get("primus-role") in mine]
        pending = any("restart pending" in r.note for r in roles.values())
        if not live and not pending:
            return JobStatus(self.job.name, "Stopped", roles, "no live applications")
        return JobStatus(self.job.name, "Running" if any(r.running for r in roles.values()) else "Pending", roles)

    # -- the interface --------------------------------------------------------------------------
    def reconcile(self, wait: float = WAVE_TIMEOUT_SECONDS) -> JobStatus:
        """Start roles wave by wave: a wave starts when the earlier ones run (waits up to ``wait`` s per
        wave, then returns; a later call continues). Restarts FAILED workers with restarts left."""
        current = self.status()
        if current.phase in ("Succeeded", "Failed"):
            return self.settle(current)
        mine = set(self.roles())
        for wave in role_rules.start_order(self.job):
            wave = [r for r in wave if r in mine and self.runnable(r)]
            deadline = time.monotonic() + wait
            while True:
                apps = self.job_apps()
                for role in wave:
                    self.create_role(role, apps)  # idempotent: starts only what is missing
                statuses = [self.role_status(r) for r in wave]
                if any(s.failed and role_rules.is_critical(self.job, s.name) for s in statuses):
                    return self.settle(self.status())
                if all(self.role_ready(s) for s in statuses):
                    break
                if time.monotonic() > deadline:
                    return self.status()
                time.sleep(POLL_SECONDS)
        current = self.status()
        return self.settle(current) if current.phase in ("Succeeded", "Failed") else current

    def settle(self, current: JobStatus) -> JobStatus:
        """A finished job (the trainer succeeded, or a critical role failed for good) stops the rest."""
        self.stop()
        return current

    def submit(self) -> JobStatus:
        if not any(is_live(a) for a in self.job_apps()):
            self.secrets.discard()  # a new submission: its connections as resolved now, not a stale copy
        return self.reconcile()

    def ensure_running(self) -> JobStatus:
        return self.reconcile()

    def scale(self, role: str, replicas: int) -> None:
        n = self.check_replicas(role, replicas)
        self._remember(role, replicas=n)
        if self.history(role):
            self.create_role(role)

    def resize(self, role: str, cpu: float | None = None, memory: float | None = None) -> None:
        """Rolling: each live worker is killed, then resubmitted with the new resource, one at a time."""
        change = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
        if any(v <= 0 for v in change.values()):
            raise ResourceError(f"job {self.job.name!r} role {role!r}: cpu/memory must be > 0, got {change}")
        self._remember(role, **change)
        for index, past in self.history(role).items():
            live = [a for a in past if is_live(a)]
            if not live:
                continue
            for app in live:
                self._kill(app)
            self._wait_ended([a["id"] for a in live])
            self._start_worker(role, index)

    def stop(self) -> None:
        mine = {r.lower() for r in self.roles()}
        killed = []
        for app in self.job_apps():
            if is_live(app) and _tags(app).get("primus-role") in mine:
                self._kill(app)
                killed.append(app["id"])
        self._wait_ended(killed)
        if not any(is_live(a) for a in self.job_apps()):  # other roles of the job may run here still
            self.secrets.discard()

    def idleness(self) -> tuple[float, float, float, float]:
        """(free share, free cores, free bytes, total cores) from the RM's cluster metrics."""
        metrics = self.client.metrics()
        cores, total_cores = float(metrics["availableVirtualCores"]), float(metrics["totalVirtualCores"] or 1)
        mem, total_mem = float(metrics["availableMB"]), float(metrics["totalMB"] or 1)
        return min(cores / total_cores, mem / total_mem), cores, mem * MIB, total_cores
