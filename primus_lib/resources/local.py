"""The embedded default: a job's roles as local processes, run by a detached supervisor
(primus_lib.resources.supervisor) whose process table any process can read to reattach."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from primus_lib.credentials import current, mount, private_directory
from primus_lib.resources.base import JobStatus, ResourceBackend, ResourceError, RoleStatus
from primus_lib.resources.table import alive, identity, locked, read_json, resources_dir, write_json
from primus_lib.settings import child_environment

START_TIMEOUT_SECONDS = 15.0
STOP_TIMEOUT_SECONDS = 20.0


class LocalBackend(ResourceBackend):
    name = "local"

    @property
    def dir(self):
        return resources_dir(self.job)

    # -- lifecycle --------------------------------------------------------------------------
    def submit(self) -> JobStatus:
        with locked(self.dir):
            if alive(read_json(self.dir / "supervisor.json")):
                return self.status()  # reattach: never a second supervisor
            self._kill_orphans()
            _remove_secrets(read_json(self.dir / "supervisor.json"))
            write_json(self.dir / "job.json", _without_password(self.job))
            write_json(self.dir / "desired.json", {"spec_path": self.spec_path, "stop": False, "roles": {}})
            (self.dir / "table.json").unlink(missing_ok=True)
            secrets = private_directory(self.job.name)
            env = child_environment(**mount(current(), self.job.connection_ids(), secrets))
            log = open(self.dir / "supervisor.log", "ab")
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "primus_lib.resources.supervisor", str(self.dir)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                )
            except BaseException:
                shutil.rmtree(secrets, ignore_errors=True)
                raise
            finally:
                log.close()
            write_json(self.dir / "supervisor.json", {**identity(proc.pid), "secrets": str(secrets)})
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if (self.dir / "table.json").exists():
                return self.status()
            if proc.poll() is not None:
                tail = (self.dir / "supervisor.log").read_text(errors="replace")[-2000:]
                raise ResourceError(f"job {self.job.name!r}: local supervisor exited {proc.returncode}:\n{tail}")
            time.sleep(0.05)
        raise ResourceError(
            f"job {self.job.name!r}: local supervisor wrote no process table in {START_TIMEOUT_SECONDS}s"
        )

    def status(self) -> JobStatus:
        table = read_json(self.dir / "table.json")
        roles_spec = self.job.spec.resources.roles
        roles: dict[str, RoleStatus]
        if table is None:
            roles = {n: RoleStatus(n, desired=s.replicas, cpu=s.cpu, memory=s.memory) for n, s in roles_spec.items()}
            return JobStatus(self.job.name, "Stopped", roles, "not submitted")
        roles = {}
        for name, row in table["roles"].items():
            workers = row["workers"]
            roles[name] = RoleStatus(
                name,
                desired=row["replicas"],
                cpu=row["cpu"],
                memory=row["memory"],
                started=row["started"],
                running=sum(w["state"] == "running" for w in workers),
                succeeded=sum(w["state"] == "succeeded" for w in workers),
                failed=sum(w["state"] == "failed" for w in workers),
                restarts=sum(w["restarts"] for w in workers),
                note=row.get("note", ""),
            )
        phase, message = table["phase"], table["message"]
        if phase in ("Pending", "Running") and not alive(read_json(self.dir / "supervisor.json")):
            phase, message = "Stopped", "the local supervisor is gone (machine restart?); ensure_running resubmits"
        return JobStatus(self.job.name, phase, roles, message)

    def workers(self) -> dict[str, list[dict]]:
        """The raw process table rows per role (PIDs, RSS, CPU percent, OOM kills)."""
        table = read_json(self.dir / "table.json", {"roles": {}})
        return {name: row["workers"] for name, row in table["roles"].items()}

    def scale(self, role: str, replicas: int) -> None:
        self._edit(role, replicas=self.check_replicas(role, replicas))

    def resize(self, role: str, cpu: float | None = None, memory: float | None = None) -> None:
        change = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
        if any(v <= 0 for v in change.values()):
            raise ResourceError(f"job {self.job.name!r} role {role!r}: cpu/memory must be > 0, got {change}")
        self.role_spec(role)
        self._edit(role, **change)

    def stop(self) -> None:
        with locked(self.dir):
            desired = read_json(self.dir / "desired.json", {})
            desired["stop"] = True
            write_json(self.dir / "desired.json", desired)
        supervisor = read_json(self.dir / "supervisor.json")
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(supervisor):
            os.kill(int(supervisor["pid"]), signal.SIGTERM)
        self._kill_orphans()
        _remove_secrets(supervisor)

    # -- helpers ----------------------------------------------------------------------------
    def _edit(self, role: str, **change) -> None:
        with locked(self.dir):
            desired = read_json(self.dir / "desired.json", {"roles": {}})
            desired.setdefault("roles", {}).setdefault(role, {}).update(change)
            write_json(self.dir / "desired.json", desired)

    def _kill_orphans(self) -> None:
        """Workers left by a dead supervisor (recorded PID + create time) are ended before a restart."""
        for rows in self.workers().values():
            for row in rows:
                if alive(row):
                    try:
                        os.killpg(int(row["pid"]), signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass


def _remove_secrets(supervisor: dict | None) -> None:
    """The roles' secret files (``credentials.private_directory``) go with the supervisor's workers."""
    if supervisor and supervisor.get("secrets"):
        shutil.rmtree(supervisor["secrets"], ignore_errors=True)


def _without_password(job) -> dict:
    """The job for the supervisor's table (it never opens the ledger): the database password masked."""
    from primus_lib.spec.job import mask_database_url

    body = job.model_dump(mode="json")
    if body["spec"]["storage"].get("database"):
        body["spec"]["storage"]["database"] = mask_database_url(body["spec"]["storage"]["database"])
    return body
