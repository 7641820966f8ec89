"""The scaling state of a job in its directory, read by whoever applies decisions.

Under ``JobPaths(...).root / "scaling"``:
    state.json        cooldown clocks, current allocation, OOM counter, usage history
    decisions.jsonl   every decision with its inputs (append-only)
    resources.json    the latest per-role CPU/memory decided by the vertical policy
                      (``primus_lib.allocation``: the format, its readers)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from primus_lib.allocation import record_allocation, role_resources
from primus_lib.resources.table import read_json, write_json
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.units import format_cpu, format_memory


class ScalingStore:
    def __init__(self, directory: Path | None) -> None:
        self.dir = directory
        self._memory_state: dict[str, Any] = {}

    def load(self) -> dict[str, Any]:
        if self.dir is None:
            return self._memory_state
        return read_json(self.dir / "state.json", {})

    def save(self, state: dict[str, Any]) -> None:
        if self.dir is None:
            self._memory_state = state
            return
        write_json(self.dir / "state.json", state)

    def record(self, decision: dict[str, Any]) -> None:
        if self.dir is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "decisions.jsonl", "a") as handle:
            handle.write(json.dumps(decision, sort_keys=True) + "\n")

    def decisions(self) -> list[dict[str, Any]]:
        if self.dir is None or not (self.dir / "decisions.jsonl").exists():
            return []
        return [json.loads(line) for line in (self.dir / "decisions.jsonl").read_text().splitlines() if line]

    def set_resources(self, role: str, cpu: float, memory: float) -> None:
        if self.dir is None:
            return
        record_allocation(self.dir, role, cpu, memory)


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
