"""The Dynamic Scaling Manager: one decision per tick, one strategy at a time, cooldowns,
every decision logged with its inputs and exported as a metric.

A tick: read a metrics snapshot -> build the context (allocation, usage history, new OOM kills) ->
ask the urgent policy first (OOM), else the policies in order while no cooldown holds -> apply
the first decision through the actuator -> record it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from primus_lib.metrics import names as n
from primus_lib.metrics.readers import MetricsReader, UsagePoint
from primus_lib.metrics.registry import registered
from primus_lib.scaling.base import Allocation, Decision, PolicyContext, ScalingPolicy
from primus_lib.scaling.horizontal import HorizontalPolicy
from primus_lib.scaling.store import ScalingStore
from primus_lib.scaling.vertical import VerticalPolicy
from primus_lib.spec.job import PrimusJob

log = logging.getLogger("primus.scaling")
HISTORY_KEEP_SECONDS = 3600.0


class Actuator(Protocol):
    """Applies a decision (backend replicas, Airflow pool slots, executor_config ...)."""

    def apply(self, decision: Decision) -> None: ...


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = registered(registry, n.DECISIONS, Counter) or Counter(
            n.DECISIONS, "Scaling decisions applied", ("primus_job", "policy", "action"), registry=registry
        )
        self.target = registered(registry, n.TARGET, Gauge) or Gauge(
            n.TARGET, "Allocation after the latest decision", ("primus_job", "role", "resource"), registry=registry
        )
        self.load = registered(registry, n.LOAD, Gauge) or Gauge(
            n.LOAD, "Horizontal load L_u", ("primus_job",), registry=registry
        )


class ScalingManager:
    def __init__(
        self,
        job: PrimusJob,
        reader: MetricsReader,
        actuator: Actuator,
        *,
        role: str = "data_executor",
        policies: Sequence[ScalingPolicy] | None = None,
        store: ScalingStore | None = None,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.job, self.reader, self.actuator, self.role, self.clock = job, reader, actuator, role, clock
        scaling = job.spec.scaling
        self.policies = (
            list(policies)
            if policies is not None
            else [HorizontalPolicy(scaling.horizontal, role), VerticalPolicy(scaling.vertical, role)]
        )
        self.store = store or ScalingStore(None)
        self.metrics = _Metrics(registry)
        self.lookback = scaling.vertical.lookback.total_seconds()

    # -- state ------------------------------------------------------------------------------
    def allocation(self, state: dict) -> Allocation:
        spec = self.job.spec.resources.roles[self.role]
        current = state.get("allocation", {})
        return Allocation(
            self.role,
            int(current.get("replicas", spec.replicas)),
            float(current.get("cpu", spec.cpu)),
            float(current.get("memory", spec.memory)),
            spec.min_count,
            spec.max_count,
        )

    def _history(self, state: dict, now: float, snapshot) -> list[UsagePoint]:
        rows = [r for r in state.get("history", []) if r[0] >= now - HISTORY_KEEP_SECONDS]
        rows.append([now, snapshot.cpu_cores_max, snapshot.memory_bytes_max])
        state["history"] = rows
        remote = self.reader.usage_history(self.lookback, self.job.spec.scaling.interval.total_seconds())
        if remote:
            return remote
        return [UsagePoint(*r) for r in rows]

    def _read_capacity(self, state: dict, now: float, snapshot, alloc: Allocation) -> float | None:
        """The peak rows/s per busy allotted core the stream executors read over the look-back. An
        executor's fixed costs (polls, Flight calls, metrics) weigh on its CPU most when it idles, so
        the rate per busy core measured now understates what it can read; the peak, from the interval
        it was busiest, understates it least. Per core, so a vertical resize keeps it."""
        rows = [r for r in state.get("read_capacity", []) if r[0] >= now - self.lookback]
        busy = snapshot.busy_read_rate
        if busy is not None and alloc.cpu > 0:
            rows.append([now, busy / alloc.cpu])
        state["read_capacity"] = rows
        return max((r[1] for r in rows), default=None)

    def _held(self, state: dict, policy: ScalingPolicy, now: float) -> bool:
        last = state.get("last_change")
        if not last:
            return False
        # one strategy at a time: after any change, wait the cooldown of the policy that made it
        settle = self._settle_of(last["policy"]) if last["policy"] != policy.name else 0.0
        own = state.get("last_by_policy", {}).get(policy.name, -1e18) + policy.cooldown_seconds()
        return now < last["at"] + settle or now < own

    def _settle_of(self, name: str) -> float:
        for policy in self.policies:
            if policy.name == name:
                return policy.settle_seconds()
        return 0.0

    # -- one tick ---------------------------------------------------------------------------
    def tick(self) -> Decision | None:
        now = self.clock()
        state = self.store.load()
        snapshot = self.reader.snapshot()
        if snapshot is None:
            log.info("scaling %s: no metrics yet, holding", self.job.name)
            return None
        oom_seen = float(state.get("oom_seen", snapshot.oom_kills))
        new_ooms = max(0.0, snapshot.oom_kills - oom_seen)
        state["oom_seen"] = snapshot.oom_kills
        alloc = self.allocation(state)
        arrived = self._just_arrived(state, snapshot.executors, alloc.replicas)
        history = self._history(state, now, snapshot)
        ctx = PolicyContext(now, snapshot, alloc, history, new_ooms, self._read_capacity(state, now, snapshot, alloc))
        loads = {}
        for policy in self.policies:
            if isinstance(policy, HorizontalPolicy):
                loads["load"] = round(policy.load(ctx), 4)
                self.metrics.load.labels(self.job.name).set(loads["load"])
        decision = self._choose(ctx, state, now, arrived)
        if decision is not None:
            self.actuator.apply(decision)
            self._record(decision, alloc, state, now)
        else:  # a hold is a decision too: log what it was made from
            inputs = {
                **snapshot.to_dict(),
                **loads,
                "replicas": alloc.replicas,
                "allocated_cpu": alloc.cpu,
                **({"held_for_arrivals": True} if arrived else {}),
            }
            log.info("scaling %s: %s hold, inputs %s", self.job.name, self.role, json.dumps(inputs, sort_keys=True))
        self.store.save(state)
        return decision

    @staticmethod
    def _just_arrived(state: dict, executors: int, replicas: int) -> bool:
        """Executors asked for earlier began to report since the last tick: the trainers' metrics of
        the past interval were measured (mostly) without them, so no non-urgent policy may act on
        them until a tick's worth of metrics includes them (else each arrival re-adds the same gap)."""
        waiting, seen = state.get("starting", False), state.get("executors_seen", executors)
        state["starting"], state["executors_seen"] = executors < replicas, executors
        return bool(waiting) and executors > seen

    def _choose(self, ctx: PolicyContext, state: dict, now: float, arrived: bool = False) -> Decision | None:
        for policy in self.policies:
            if policy.urgent(ctx):
                decision = policy.decide(ctx)
                if decision is not None:
                    return decision
        if arrived:
            return None
        for policy in self.policies:
            if self._held(state, policy, now):
                continue
            decision = policy.decide(ctx)
            if decision is not None:
                return decision
        return None

    def _record(self, decision: Decision, alloc: Allocation, state: dict, now: float) -> None:
        current = state.setdefault("allocation", {"replicas": alloc.replicas, "cpu": alloc.cpu, "memory": alloc.memory})
        for key in ("replicas", "cpu", "memory"):
            value = getattr(decision, key)
            if value is not None:
                current[key] = value
                self.metrics.target.labels(self.job.name, decision.role, key).set(value)
        state["last_change"] = {"policy": decision.policy, "at": now}
        state.setdefault("last_by_policy", {})[decision.policy] = now
        self.metrics.decisions.labels(self.job.name, decision.policy, decision.action).inc()
        if decision.action == "resize":
            self.store.set_resources(decision.role, current["cpu"], current["memory"])
        record = decision.to_dict()
        self.store.record(record)
        log.info("scaling %s: %s", self.job.name, json.dumps(record, sort_keys=True, default=str))


class BackendActuator:
    """Applies decisions through a ResourceBackend (stream executors' replicas, resize)."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def apply(self, decision: Decision) -> None:
        if decision.replicas is not None:
            self.backend.scale(decision.role, decision.replicas)
        if decision.action == "resize":
            self.backend.resize(decision.role, cpu=decision.cpu, memory=decision.memory)
