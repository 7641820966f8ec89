"""A trace-driven model of data executors feeding trainers, minute by minute (for bench/scaling.py
and the soundness tests). The Dynamic Scaling Manager runs on it unchanged: a reader turns the
model's state into metric snapshots and an actuator turns decisions into model changes.

Per second: executors produce up to n x min(cores, PARALLELISM) / cost(t) samples (a data executor
cannot use more than PARALLELISM cores: its task runners are that many), never more than the
buffer has room for (back-pressure); the trainers take up to their capacity from the buffer;
what they do not get is starvation. Added executors start after STARTUP_SECONDS.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from primus_lib.metrics.readers import MetricsReader, Snapshot
from primus_lib.scaling.base import Decision

PARALLELISM = 5.2  # cores a data executor can keep busy (task runners)
STARTUP_SECONDS = 120  # pod scheduling + image pull + first task
BUFFER_SECONDS = 30.0  # each executor buffers this many seconds of its own output
MEMORY_AT_FULL = 16 * 2**30  # bytes an executor needs with full buffers ...
MEMORY_BASE = 0.55  # ... of which this share with empty buffers
PEAK_JITTER = 1.08  # the busiest executor uses this much more than the mean (capped by PARALLELISM)


@dataclass
class Load:
    """The load at one instant: cost per sample (core-seconds) and the trainers' demand (samples/s)."""

    cost: float
    demand: float


@dataclass
class PoolModel:
    executors: int
    cores: float
    memory: float
    buffered: float = 0.0
    pending: list[tuple[float, int]] = field(default_factory=list)  # (ready at, count)
    oom_kills: int = 0
    now: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    # per-tick observations
    starved: float = 0.0
    backpressure: float = 0.0
    used_cores: float = 0.0
    trained: float = 0.0
    mem_bytes: float = 0.0

    def capacity(self) -> float:
        return self.executors * BUFFER_SECONDS

    def run(self, load: Load, seconds: int = 60) -> None:
        """Advance ``seconds`` seconds under ``load``."""
        starved = full = used = trained = 0.0
        for _ in range(seconds):
            self.now += 1
            ready = sum(c for t, c in self.pending if t <= self.now)
            if ready:
                self.executors += ready
                self.pending = [(t, c) for t, c in self.pending if t > self.now]
            rate = self.executors * min(self.cores, PARALLELISM) / load.cost  # samples/s the pool can make
            cap = self.capacity() * rate / max(self.executors, 1)
            room = max(0.0, cap - self.buffered)
            produced = min(rate, room + load.demand)
            take = min(load.demand, self.buffered + produced)
            self.buffered = min(cap, self.buffered + produced - take)
            starved += 1.0 - take / load.demand
            full += 1.0 if self.buffered >= 0.95 * cap else 0.0
            used += produced * load.cost
            trained += take
        self.starved, self.backpressure = starved / seconds, full / seconds
        self.used_cores, self.trained = used / seconds, trained
        self.mem_bytes = MEMORY_AT_FULL * (MEMORY_BASE + (1 - MEMORY_BASE) * self.fill(load))
        if self.mem_bytes > self.memory:  # the kernel's OOM killer; the executor restarts
            self.oom_kills += 1
            self.buffered *= 0.9

    def fill(self, load: Load) -> float:
        rate = self.executors * min(self.cores, PARALLELISM) / load.cost
        cap = self.capacity() * rate / max(self.executors, 1)
        return 0.0 if cap <= 0 else min(1.0, self.buffered / cap)

    def snapshot(self, load: Load) -> Snapshot:
        per_exec = self.used_cores / max(self.executors, 1)
        mem_bytes = self.mem_bytes
        return Snapshot(
            at=self.now,
            executors=self.executors,
            buffer=self.fill(load),
            cpu=min(1.0, per_exec / self.cores),
            memory=min(1.0, mem_bytes / self.memory),
            cpu_cores_max=min(per_exec * PEAK_JITTER, PARALLELISM, self.cores),
            memory_bytes_max=mem_bytes * PEAK_JITTER,
            oom_kills=self.oom_kills,
            trainer_starved=self.starved,
            trainer_backpressure=self.backpressure,
        )


class ModelReader(MetricsReader):
    def __init__(self, model: PoolModel, load: Callable[[], Load]) -> None:
        super().__init__("sim")
        self.model, self.load = model, load

    def snapshot(self) -> Snapshot:
        return self.model.snapshot(self.load())


class ModelActuator:
    """Applies decisions to the model: removals at once, additions after STARTUP_SECONDS."""

    def __init__(self, model: PoolModel) -> None:
        self.model = model
        self.applied: list[Decision] = []

    def apply(self, decision: Decision) -> None:
        m = self.model
        self.applied.append(decision)
        if decision.replicas is not None:
            live = m.executors + sum(c for _, c in m.pending)
            if decision.replicas > live:
                m.pending.append((m.now + STARTUP_SECONDS, decision.replicas - live))
            else:
                drop = live - decision.replicas
                from_pending = min(drop, sum(c for _, c in m.pending))
                m.pending = [] if from_pending else m.pending
                m.executors -= drop - from_pending
        if decision.cpu is not None:
            m.cores = decision.cpu
        if decision.memory is not None:
            m.memory = decision.memory


def daily_load(
    minute: int,
    *,
    trainers: int,
    trainer_rate: float,
    batch_cost: float,
    stream_cost: float,
    surge: tuple[int, int, float] | None = None,
) -> Load:
    """Trainers want ``trainers x trainer_rate`` samples/s; the share of (costlier) stream samples
    follows the day's traffic (peak at 20:00, trough at 05:00), with an optional surge
    (start minute, end minute, extra stream share)."""
    hour = (minute / 60.0) % 24
    share = 0.25 + 0.15 * math.cos((hour - 20.0) / 24.0 * 2 * math.pi)
    if surge and surge[0] <= minute < surge[1]:
        share = min(0.95, share + surge[2])
    return Load(cost=(1 - share) * batch_cost + share * stream_cost, demand=trainers * trainer_rate)
