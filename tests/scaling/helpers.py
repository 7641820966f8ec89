"""Builders for scaling tests: snapshots, contexts, a job with the policies' defaults."""

from __future__ import annotations

import dataclasses

from primus_lib.metrics.readers import Snapshot, UsagePoint
from primus_lib.scaling.base import Allocation, PolicyContext
from primus_lib.spec import PrimusJob
from tests.resources.conftest import DEMO

GIB = 2**30


def snapshot(buffer=0.5, cpu=0.5, memory=0.5, starved=0.0, backpressure=0.0, executors=-1, cores=2.0,
             mem_bytes=2 * GIB, ooms=0.0, at=0.0) -> Snapshot:  # fmt: skip
    return Snapshot(at=at, executors=executors, buffer=buffer, cpu=cpu, memory=memory, cpu_cores_max=cores,
                    memory_bytes_max=mem_bytes, oom_kills=ooms, trainer_starved=starved,
                    trainer_backpressure=backpressure)  # fmt: skip


def context(snap: Snapshot, replicas=10, cpu=4.0, memory=8 * GIB, lo=1, hi=100, history=(), ooms=0.0, now=1000.0):
    """A context; the snapshot's reporting executors default to ``replicas`` (none starting)."""
    if snap.executors == -1:
        snap = dataclasses.replace(snap, executors=replicas)
    return PolicyContext(now, snap, Allocation("data_executor", replicas, cpu, memory, lo, hi), list(history), ooms)


def history(cores: list[float], mem: list[float] | None = None, end: float = 1000.0, step: float = 60.0):
    mem = mem or [4 * GIB] * len(cores)
    start = end - step * (len(cores) - 1)
    return [UsagePoint(start + i * step, c, m) for i, (c, m) in enumerate(zip(cores, mem, strict=True))]


def job(scaling: dict | None = None, role: dict | None = None) -> PrimusJob:
    import os

    os.environ.setdefault("PRIMUS_DATA", "/tmp")
    from primus_lib.spec import load_job

    doc = load_job(DEMO).model_dump(mode="json", exclude_none=True)
    doc["spec"]["scaling"] = scaling or {}
    if role:
        doc["spec"]["resources"]["roles"]["data_executor"] = role
    return PrimusJob.model_validate(doc)
