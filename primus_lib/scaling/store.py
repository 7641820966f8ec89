"""The scaling state of a job with its shared state, read by whoever applies decisions.

Under ``allocations_dir(job) / ROLE`` (the job's ``storage.root``: a local directory, s3:// or
webhdfs://, so scaler runs on different workers share cooldowns and history):
    state.json        cooldown clocks, current allocation, OOM counter, usage history
    decisions.jsonl   every decision with its inputs (append-only)
    resources.json    the latest per-role CPU/memory decided by the vertical policy
                      (``primus_lib.allocation``: the format, its readers)
"""

from __future__ import annotations

import json
from typing import Any

from primus_lib.allocation import allocations_dir, record_allocation, role_resources
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.units import format_cpu, format_memory
from primus_lib.storage import Where, locate

STATE_FILE, DECISIONS_FILE = "state.json", "decisions.jsonl"


class ScalingStore:
    """One role's scaling state under ``directory`` (None: in memory only). Each file is replaced
    whole with ``put_atomic``; decisions.jsonl too (no append on an object store: the scaler is its
    one writer)."""

    def __init__(self, directory: Where | None) -> None:
        self.dir = locate(directory) if directory is not None else None
        self._memory_state: dict[str, Any] = {}

    def load(self) -> dict[str, Any]:
        if self.dir is None:
            return self._memory_state
        text = self._read(STATE_FILE)
        try:
            return json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.dir / STATE_FILE}: not valid JSON ({exc})") from exc

    def save(self, state: dict[str, Any]) -> None:
        if self.dir is None:
            self._memory_state = state
            return
        (self.dir / STATE_FILE).put_atomic(json.dumps(state, indent=1, sort_keys=True).encode("utf-8"))

    def record(self, decision: dict[str, Any]) -> None:
        if self.dir is None:
            return
        line = json.dumps(decision, sort_keys=True) + "\n"
        (self.dir / DECISIONS_FILE).put_atomic((self._read(DECISIONS_FILE) + line).encode("utf-8"))

    def decisions(self) -> list[dict[str, Any]]:
        if self.dir is None:
            return []
        return [json.loads(line) for line in self._read(DECISIONS_FILE).splitlines() if line]

    def _read(self, name: str) -> str:
        try:
            return (self.dir / name).read_text()  # type: ignore[operator]
        except FileNotFoundError:
            return ""

    def set_resources(self, role: str, cpu: float, memory: float) -> None:
        if self.dir is None:
            return
        record_allocation(self.dir, role, cpu, memory)


def replicas_in(state: dict[str, Any], spec_replicas: int) -> int:
    """The role's worker count in its loaded state: the horizontal policy's latest, else the spec's."""
    return int(state.get("allocation", {}).get("replicas", spec_replicas))


def role_replicas(job: PrimusJob, role: str) -> int:
    """How many workers the role has now, at least 1 (1 when the spec has no such role)."""
    spec = job.spec.resources.roles.get(role)
    if spec is None:
        return 1
    return max(1, replicas_in(ScalingStore(allocations_dir(job) / role).load(), spec.replicas))


def executor_config(job: PrimusJob, role: str = "data_executor") -> dict[str, Any]:
    """``executor_config`` for a mapped task on the KubernetesExecutor: a pod_override whose base
    container gets the role's current requests/limits."""
    from kubernetes.client import models as k8s

    try:
        cpu, memory = role_resources(job, role)
    except (OSError, ValueError):  # shared state unreadable where the DAG is parsed: the spec's size (the
        spec = job.spec.resources.roles[role]  # pod_mutation_hook, primus_operators.policies, applies decisions)
        cpu, memory = spec.cpu, spec.memory
    resources = k8s.V1ResourceRequirements(
        requests={"cpu": format_cpu(cpu), "memory": format_memory(memory)},
        limits={"cpu": format_cpu(cpu), "memory": format_memory(memory)},
    )
    pod = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", resources=resources)]))
    return {"pod_override": pod}
