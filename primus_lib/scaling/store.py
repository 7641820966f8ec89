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
from pathlib import Path
from typing import Any

from primus_lib.allocation import record_allocation, role_resources
from primus_lib.resources.table import read_json, write_json
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.units import format_cpu, format_memory
from primus_lib.storage import StorageLocation

STATE_FILE, DECISIONS_FILE = "state.json", "decisions.jsonl"


class ScalingStore:
    def __init__(self, directory: Path | StorageLocation | None) -> None:
        self.dir = directory
        self._memory_state: dict[str, Any] = {}

    def load(self) -> dict[str, Any]:
        if self.dir is None:
            return self._memory_state
        if isinstance(self.dir, StorageLocation):
            text = self._read_remote(STATE_FILE)
            return json.loads(text) if text else {}
        return read_json(self.dir / STATE_FILE, {})

    def save(self, state: dict[str, Any]) -> None:
        if self.dir is None:
            self._memory_state = state
            return
        if isinstance(self.dir, StorageLocation):
            (self.dir / STATE_FILE).put_atomic(json.dumps(state, indent=1, sort_keys=True).encode("utf-8"))
            return
        write_json(self.dir / STATE_FILE, state)

    def record(self, decision: dict[str, Any]) -> None:
        if self.dir is None:
            return
        line = json.dumps(decision, sort_keys=True) + "\n"
        if isinstance(self.dir, StorageLocation):  # no append on an object store: the scaler is the one writer
            (self.dir / DECISIONS_FILE).put_atomic((self._read_remote(DECISIONS_FILE) + line).encode("utf-8"))
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / DECISIONS_FILE, "a") as handle:
            handle.write(line)

    def decisions(self) -> list[dict[str, Any]]:
        if self.dir is None:
            return []
        if isinstance(self.dir, StorageLocation):
            text = self._read_remote(DECISIONS_FILE)
        elif (self.dir / DECISIONS_FILE).exists():
            text = (self.dir / DECISIONS_FILE).read_text()
        else:
            return []
        return [json.loads(line) for line in text.splitlines() if line]

    def _read_remote(self, name: str) -> str:
        try:
            return (self.dir / name).read_text()
        except FileNotFoundError:
            return ""

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
