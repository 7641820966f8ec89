"""The local backend's supervisor: one detached process per job that starts the roles in order,
restarts failed workers, enforces their limits (``primus_lib.resources.limits``: thread counts in the
environment, pinned cores, a cgroup v2 memory.max/cpu.max where the machine allows, else a cgroup v1
CPU quota where that is (``cpu_quota``), and in any case an RSS over the limit killed like a cgroup
OOM kill), applies scale/resize requests and writes the process table.

Run as ``python -m primus_lib.resources.supervisor RESOURCES_DIR``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from primus_lib.metrics.names import OOM_KILLS
from primus_lib.paths import JobPaths
from primus_lib.resources import cgroup, limits
from primus_lib.resources import roles as role_rules
from primus_lib.resources.cpu_quota import CpuQuota, v1_cpu_parent
from primus_lib.resources.table import identity, read_json, write_json
from primus_lib.resources.workers import Role, Worker
from primus_lib.settings import child_environment, settings
from primus_lib.spec.job import PrimusJob

POLL_SECONDS = 0.25
METRICS_SECONDS = 30.0
STOP_GRACE_SECONDS = 5.0


class Supervisor:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.job = PrimusJob.model_validate(read_json(directory / "job.json"))
        self.spec_path = read_json(directory / "desired.json", {}).get("spec_path")
        self.phase = "Pending"
        self.message = ""
        self.roles: dict[str, Role] = {}
        for name, spec in self.job.spec.resources.roles.items():
            command = role_rules.command_for(self.job, name, self.spec_path)
            self.roles[name] = Role(
                name,
                command,
                spec.replicas,
                spec.cpu,
                spec.memory,
                spec.max_restarts,
                role_rules.is_critical(self.job, name),
            )
            if command is None:
                self.roles[name].note = "not started locally: no command and no runnable default"
        self.waves = role_rules.start_order(self.job)
        self.stopping = False
        self._metrics_rows: list = []
        self._metrics_at = -1e9
        (directory / "logs").mkdir(exist_ok=True)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "stopping", True))
        try:
            return self._loop()
        except BaseException:  # a supervisor that dies must not leave its workers running
            self.stop_all()
            raise

    def _loop(self) -> int:
        while True:
            self.apply_desired()
            if self.stopping:
                self.stop_all()
                self.phase = "Stopped" if self.phase not in ("Succeeded", "Failed") else self.phase
                self.write()
                return 0
            self.start_waves()
            self.watch()
            self.write()
            if self.phase in ("Succeeded", "Failed"):
                self.stop_all()
                self.write()
                return 0 if self.phase == "Succeeded" else 1
            time.sleep(POLL_SECONDS)

    def apply_desired(self) -> None:
        desired = read_json(self.dir / "desired.json", {})
        if desired.get("stop"):
            self.stopping = True
        for name, want in desired.get("roles", {}).items():
            role = self.roles.get(name)
            if role is None:
                continue
            role.replicas = int(want.get("replicas", role.replicas))
            cpu, memory = float(want.get("cpu", role.cpu)), float(want.get("memory", role.memory))
            if (cpu, memory) != (role.cpu, role.memory):
                role.cpu, role.memory = cpu, memory
                for worker in role.workers.values():  # rolling restart with the new limits
                    if worker.state == "running":
                        self.terminate(worker)
                        self.launch(role, worker)
            if role.started:
                self.reconcile_count(role)

    def start_waves(self) -> None:
        for wave in self.waves:
            for name in wave:
                role = self.roles[name]
                if not role.started and role.command is not None:
                    role.started = True
                    self.reconcile_count(role)
                    self.phase = "Running"
            if not all(self.ready(self.roles[name]) for name in wave):
                return  # later waves wait for this one

    def ready(self, role: Role) -> bool:
        if role.command is None:
            return True
        running = sum(w.state in ("running", "succeeded") for w in role.workers.values())
        return role.started and running >= min(role.replicas, 1) and running >= role.replicas

    def reconcile_count(self, role: Role) -> None:
        active = sorted(i for i, w in role.workers.items() if w.state in ("running", "pending"))
        for index in active[role.replicas :]:
            self.terminate(role.workers[index])
            role.workers[index].state = "stopped"
            self.release_cgroup(role.workers[index])
        for index in range(role.replicas):
            worker = role.workers.get(index)
            if worker is None or worker.state == "stopped":
                worker = Worker(index)
                role.workers[index] = worker
                self.launch(role, worker)

    def launch(self, role: Role, worker: Worker) -> None:
        command = role.command
        if command is None:  # start_waves starts only roles with a command
            raise RuntimeError(f"role {role.name!r} has no command to launch")
        env = child_environment()
        env.update(limits.thread_env(limits.Limits(role.cpu, role.memory).threads))
        env.update(
            {
                "PRIMUS_JOB": self.job.name,
                "PRIMUS_ROLE": role.name,
                "PRIMUS_REPLICA_INDEX": str(worker.index),
                "PRIMUS_REPLICAS": str(role.replicas),
                "PRIMUS_CPU": str(role.cpu),
                "PRIMUS_MEMORY": str(int(role.memory)),
                "PRIMUS_RESTARTS": str(worker.restarts),
            }
        )
        self.release_cgroup(worker)
        log = open(self.dir / "logs" / f"{role.name}-{worker.index}.log", "ab")
        try:
            worker.proc = proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as exc:
            worker.state, worker.exit_code = "failed", -1
            self.message = f"role {role.name!r} worker {worker.index}: cannot start {command[0]!r}: {exc}"
            return
        finally:
            log.close()
        worker.state, worker.exit_code, worker._ps = "running", None, None
        worker.cores = sorted(limits.pin_cores(proc.pid, role.cpu, worker.index))  # spread by index
        self.confine(role, worker)

    def confine(self, role: Role, worker: Worker) -> None:
        """The worker's own cgroup (memory.max, cpu.max) where cgroup v2 allows; else the RSS check in
        account(); its CPU capped through cgroup v1 where v2 gave it no cpu.max."""
        self.confine_v2(role, worker)
        if worker._group is None or not (worker._group.path / "cpu.max").exists():
            self.cap_cpu(role, worker)

    def cap_cpu(self, role: Role, worker: Worker) -> None:
        """A fractional allotment as a cgroup v1 quota (whole cores are what ``pin_cores`` gives: a
        cgroup there would only weigh the worker's threads as one task's share under contention)."""
        parent, _ = v1_cpu_parent(settings().cgroup or "")
        if parent is None or float(role.cpu).is_integer():
            return
        try:
            quota = CpuQuota.make(parent, f"primus-{self.job.name}-{role.name}-{worker.index}", role.cpu)
            quota.add(worker.process.pid)
        except OSError as exc:
            self.message = f"role {role.name!r} worker {worker.index}: no cgroup v1 CPU quota under {parent}: {exc}"
            return
        worker._quota, worker.cpu_quota = quota, str(quota.path)

    def confine_v2(self, role: Role, worker: Worker) -> None:
        parent, _ = cgroup.cgroup_parent()
        if parent is None:
            return
        name = f"primus-{self.job.name}-{role.name}-{worker.index}"
        try:
            group = cgroup.Cgroup.make(parent, name, cpu=role.cpu, memory_max=role.memory)
            group.add(worker.process.pid)
        except OSError as exc:
            self.message = f"role {role.name!r} worker {worker.index}: no cgroup under {parent}: {exc}"
            return
        worker._group, worker.cgroup = group, str(group.path)

    def release_cgroup(self, worker: Worker) -> bool:
        """Remove the worker's cgroups; True if the kernel OOM-killed in it."""
        if worker._quota is not None:
            worker._quota.remove()
            worker._quota, worker.cpu_quota = None, ""
        group, worker._group, worker.cgroup = worker._group, None, ""
        if group is None:
            return False
        killed = group.oom_kills() > group.ooms_before
        group.remove()
        return killed

    def watch(self) -> None:
        for role in self.roles.values():
            for worker in role.workers.values():
                if worker.state != "running" or worker.proc is None:
                    continue
                code = worker.proc.poll()
                if code is None:
                    self.account(role, worker)
                    continue
                worker.exit_code = code
                if self.release_cgroup(worker):  # the kernel killed it at memory.max
                    worker.oom_kills += 1
                    self.message = f"role {role.name!r} worker {worker.index}: OOM kill in its cgroup"
                self.exited(role, worker, code)
        self.check_success()

    def account(self, role: Role, worker: Worker) -> None:
        """Real accounting with psutil: RSS of the worker's process tree, CPU percent."""
        try:
            if worker._ps is None:
                worker._ps = psutil.Process(worker.process.pid)
                worker._ps.cpu_percent(None)
            procs = [worker._ps, *worker._ps.children(recursive=True)]
            worker.rss = sum(p.memory_info().rss for p in procs)
            worker.cpu_percent = worker._ps.cpu_percent(None)
        except psutil.Error:
            return
        if role.memory > 0 and worker.rss > role.memory:
            worker.oom_kills += 1
            self.message = (
                f"role {role.name!r} worker {worker.index}: RSS {worker.rss} > limit {int(role.memory)}: OOM kill"
            )
            self.kill_tree(worker, signal.SIGKILL)
            worker.process.wait(5)
            worker.exit_code = 137
            self.exited(role, worker, 137)

    def exited(self, role: Role, worker: Worker, code: int) -> None:
        if code == 0:
            worker.state = "succeeded"
            return
        if worker.restarts < role.max_restarts:
            worker.restarts += 1
            self.launch(role, worker)
            return
        worker.state = "failed"
        if role.critical:
            self.phase = "Failed"
            self.message = (
                f"critical role {role.name!r} worker {worker.index} failed (exit {code}) "
                f"after {worker.restarts} restarts"
            )

    def check_success(self) -> None:
        if self.phase == "Failed":
            return
        for name in role_rules.SUCCESS_ROLES:
            role = self.roles.get(name)
            if role is None or role.command is None or not role.workers:
                return
            done = [w for w in role.workers.values() if w.state != "stopped"]
            if not done or any(w.state != "succeeded" for w in done):
                return
        self.phase = "Succeeded"
        self.message = "every worker of " + ", ".join(role_rules.SUCCESS_ROLES) + " exited 0"

    # -- stopping ---------------------------------------------------------------------------
    def kill_tree(self, worker: Worker, sig: int) -> None:
        try:
            os.killpg(worker.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self, worker: Worker) -> None:
        if worker.proc is None or worker.proc.poll() is not None:
            return
        self.kill_tree(worker, signal.SIGTERM)
        try:
            worker.proc.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill_tree(worker, signal.SIGKILL)
            worker.proc.wait(5)

    def stop_all(self) -> None:
        for role in self.roles.values():
            for worker in role.workers.values():
                if worker.state == "running":
                    self.terminate(worker)
                    worker.state = "stopped"
                self.release_cgroup(worker)

    def write_metrics(self) -> None:
        """OOM kills per worker into the job's metrics dir (a killed worker cannot report its own),
        read by the scaler's TextfileReader; refreshed at least every METRICS_SECONDS."""
        rows = [(r.name, w.index, w.oom_kills) for r in self.roles.values() for w in r.workers.values()]
        now = time.monotonic()
        if rows == self._metrics_rows and now - self._metrics_at < METRICS_SECONDS:
            return
        self._metrics_rows, self._metrics_at = rows, now
        lines = [f"# HELP {OOM_KILLS} OOM kills of this executor", f"# TYPE {OOM_KILLS} counter"]
        for role, index, count in rows:
            lines.append(f'{OOM_KILLS}{{primus_job="{self.job.name}",role="{role}",worker="{index}"}} {float(count)}')
        snapshot = JobPaths.for_job(self.job).metrics_dir / "supervisor.prom"
        snapshot.put_atomic(("\n".join(lines) + "\n").encode("utf-8"), durable=False)

    def write(self) -> None:
        self.write_metrics()
        roles = {
            name: {
                "replicas": r.replicas,
                "cpu": r.cpu,
                "memory": r.memory,
                "started": r.started,
                "note": r.note,
                "workers": [w.row() for w in r.workers.values()],
            }
            for name, r in self.roles.items()
        }
        write_json(
            self.dir / "table.json",
            {
                "phase": self.phase,
                "message": self.message,
                "roles": roles,
                "updated": time.time(),
                "supervisor": identity(os.getpid()),
            },
        )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m primus_lib.resources.supervisor RESOURCES_DIR", file=sys.stderr)
        return 2
    return Supervisor(Path(argv[0])).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
