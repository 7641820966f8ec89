"""Data tasks packed into the orchestrator's units of work: one Airflow task runs several.

A planned data task is one file (or one byte range of a large one): a partition of thousands of
files would otherwise be thousands of mapped task instances, each paying a process, a spec
load and the scheduler's bookkeeping around tens of milliseconds of decoding, and past Airflow's
``[core] max_map_length`` (1024) the DAG run fails. Packing follows Spark's file splits: every
task weighs its bytes plus an open cost; units hold about ``TARGET_BYTES`` each, but never fewer
than the executors that can run them at once (so none idles) and never more than the limit.
The tasks stay the units of staging and the Joiner's plan, so packing changes no output.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from primus_lib.data.task import DataTask

TARGET_BYTES = 128 * 2**20  # Spark's spark.sql.files.maxPartitionBytes
OPEN_COST_BYTES = 4 * 2**20  # Spark's spark.sql.files.openCostInBytes: a file's fixed cost, as bytes


def weight(task: DataTask) -> int:
    """What a task costs to run, in bytes: its range (or file) plus the cost of opening it."""
    return (task.size if task.length is None else task.length) + OPEN_COST_BYTES


def pack(tasks: Sequence[DataTask], slots: int, limit: int | None = None) -> list[list[DataTask]]:
    """``tasks`` in units for ``slots`` executors at once, at most ``limit`` units.

    Units are balanced by weight (the heaviest task to the lightest unit); each keeps its tasks in
    the planned order, and the units are ordered by their first task."""
    if slots < 1:
        raise ValueError(f"slots: expected at least 1 executor, got {slots}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit: expected at least 1 unit, got {limit}")
    if not tasks:
        return []
    weights = [weight(task) for task in tasks]
    count = max(slots, math.ceil(sum(weights) / TARGET_BYTES))
    count = min(count, len(tasks), limit or len(tasks))
    units: list[list[int]] = [[] for _ in range(count)]
    lightest = [(0, unit) for unit in range(count)]  # (load, unit): a heap, ties to the lower unit
    for index in sorted(range(len(tasks)), key=lambda i: (-weights[i], i)):
        load, unit = heapq.heappop(lightest)
        units[unit].append(index)
        heapq.heappush(lightest, (load + weights[index], unit))
    ordered = sorted((sorted(unit) for unit in units), key=lambda unit: unit[0])
    return [[tasks[i] for i in unit] for unit in ordered]
