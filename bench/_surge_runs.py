"""Scaled vs static with real processes: bench/surge.py's scenario (Kafka, ``primus executor`` stream
executors and ``primus train`` on the local backend, a 10x surge, heavy rows) run once with the scaler
ticking and once per fixed stream-executor count 1..N with no scaler at all (the static allocations),
all on one Kafka broker, each run on a topic of its own with the same producer schedule.

Per run, over the sampled window (the producer's schedule and the tail):
- ``core_seconds``: the stream executors' allotment (the role's ``cpu``, a hard cap where the machine
  has a cgroup CPU controller) x the seconds each process was alive; ``used_cpu_seconds`` (psutil, the
  process trees, start-up included); ``cpu_util`` = used / allotted;
- ``stream_rows_trained`` and ``rows_per_core_second`` (rows trained per allotted executor core-second);
- ``trainer_starvation``: the mean of the trainer's ``primus_trainer_starved_ratio`` over the samples;
- ``trainer_starvation_behind``: the same ratio counted only while the executors were behind Kafka
  (their reported lag at least ``STREAM_LAG_MIN_ROWS``), else 0, averaged over the window: the share of
  the trainer's time lost waiting for rows that were already in Kafka. Mean starvation alone cannot
  tell allocations apart: a trainer that trains the same rows in the same window waits the same total
  time (its wait is the window minus its step time), so every allocation that catches up before the
  window ends reads the same, however stale its rows were; this one counts only the waiting more
  executors could have removed (at the live edge the source is the limit, whatever the count).

``ratio_real`` = rows per core-second of the scaled run / that of the best static run among those
whose ``trainer_starvation_behind`` is no worse than the scaled run's; where none is, against the
least starved static run, a lower bound (``ratio_real_basis`` says which).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from bench import surge
from devstack.kafka import KafkaServer, kafka_classpath, mounted_server
from primus_lib.scaling.horizontal import STREAM_LAG_MIN_ROWS

ROLE = "stream_executor"
# the literal rule beside it: mean trainer starvation no worse than the scaled run's, within this
# (what one configuration's runs spread by on this loaded machine, docs/scaling.md)
STARVATION_NOISE = 0.05


@dataclass
class _Seen:
    cpu: float  # allocated cores
    first: float  # wall clock, clipped to the window's start
    last: float
    cpu_base: float  # CPU-seconds it had used when the window began (0 if started inside it)
    cpu_last: float


@dataclass
class RoleUsage:
    """Allocated core-seconds and used CPU-seconds of one role's processes, from the process table."""

    role: str
    began: float | None = None
    seen: dict[tuple[int, float], _Seen] = field(default_factory=dict)

    def __call__(self, backend, elapsed: float) -> None:
        now = time.time()
        self.began = now if self.began is None else self.began
        status = backend.status().roles.get(self.role)
        for row in backend.workers().get(self.role, []):
            if row.get("state") != "running" or not row.get("pid"):
                continue
            key = (int(row["pid"]), float(row["create_time"]))
            try:
                used = _tree_cpu_seconds(psutil.Process(key[0]))
            except psutil.Error:
                continue
            entry = self.seen.get(key)
            if entry is None:
                base = used if key[1] < self.began else 0.0
                entry = self.seen[key] = _Seen(status.cpu, max(key[1], self.began), now, base, used)
            entry.last, entry.cpu_last = now, max(entry.cpu_last, used)

    def figures(self) -> dict:
        core_seconds = sum(s.cpu * (s.last - s.first) for s in self.seen.values())
        used = sum(s.cpu_last - s.cpu_base for s in self.seen.values())
        began = self.began or 0.0
        return {
            "core_seconds": round(core_seconds, 1),
            "used_cpu_seconds": round(used, 1),
            "cpu_util": round(used / core_seconds, 4) if core_seconds else None,
            "processes": [
                [round(s.first - began, 1), round(s.last - began, 1), s.cpu, round(s.cpu_last - s.cpu_base, 1)]
                for s in self.seen.values()
            ],
        }


def _tree_cpu_seconds(process: psutil.Process) -> float:
    """CPU-seconds of a worker and its live descendants (and the children it has reaped)."""
    total = 0.0
    for proc in (process, *process.children(recursive=True)):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + (times.children_user + times.children_system if proc is process else 0)
    return total


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(float(np.mean(values)), 4) if values else None


def behind(rows: list[dict]) -> list[bool]:
    """Per sample: were the executors behind Kafka (their own reported lag at least STREAM_LAG_MIN_ROWS)?"""
    return [(r["executor_lag"] or 0) >= STREAM_LAG_MIN_ROWS for r in rows]


def starvation_behind(rows: list[dict]) -> float | None:
    """The trainer's starved ratio while the executors were behind Kafka, 0 elsewhere, averaged."""
    return _mean([(r["trainer_starved"] or 0.0) if late else 0.0 for r, late in zip(rows, behind(rows), strict=True)])


def one_run(args: argparse.Namespace, replicas: int, scale: bool, server: KafkaServer | None = None) -> dict:
    executors, trainer = RoleUsage(ROLE), RoleUsage("trainer")
    load_before = os.getloadavg()[0]
    rows, decisions, queued_at = surge.run_surge(
        args, replicas, scale, lambda b, t: (executors(b, t), trainer(b, t)), server
    )
    phases = (args.before, args.before + args.surge)
    brief = surge.summary(rows, decisions, phases, args, queued_at)
    in_surge = [r for r in rows if phases[0] <= r["t"] < phases[1]]
    usage = executors.figures()
    trained = rows[-1]["stream_served"] - rows[0]["stream_served"]
    late = behind(rows)
    return {
        "executors": f"scaled from {replicas}" if scale else f"static {replicas}",
        **usage,
        "stream_rows_trained": trained,
        "rows_per_core_second": round(trained / usage["core_seconds"], 1) if usage["core_seconds"] else None,
        "trainer_used_cpu_seconds": trainer.figures()["used_cpu_seconds"],
        "trainer_starvation": _mean([r["trainer_starved"] for r in rows]),
        "trainer_starvation_behind": starvation_behind(rows),
        "trainer_starvation_surge": _mean([r["trainer_starved"] for r in in_surge]),
        "behind_kafka_s": round(sum(late) * surge.SAMPLE_EVERY, 1),
        "lag_row_seconds": round(sum(max(0, r["lag_rows"]) for r in rows) * surge.SAMPLE_EVERY),
        "window_s": rows[-1]["t"],
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        **{k: brief[k] for k in ("lag_peak", "drain_s", "lag_end", "executors_max", "executor_lag_max_by_phase")},
        "decisions": [{k: d[k] for k in ("t", "action", "replicas")} for d in decisions],
    }


def _best_static(
    scaled: dict, runs: dict[int, dict], key: str, tolerance: float = 0.0
) -> tuple[int | None, float | None]:
    """(executors, ratio) of the static run with the most rows per core-second among those whose
    ``key`` starvation is at most the scaled run's (+ ``tolerance``); (None, None) if none is."""
    bound = scaled[key]
    meeting = [n for n, r in runs.items() if bound is not None and r[key] is not None and r[key] <= bound + tolerance]
    if not meeting:
        return None, None
    best = max(meeting, key=lambda n: runs[n]["rows_per_core_second"])
    return best, round(scaled["rows_per_core_second"] / runs[best]["rows_per_core_second"], 4)


def best_static_behind(scaled: dict, runs: dict[int, dict]) -> tuple[int | None, float | None, str]:
    """(executors, ratio, basis) against the static runs by ``trainer_starvation_behind``: the best
    static at no more starvation; where every static count starved more than the scaled run, the
    least starved of them, a lower bound (a static count that starved no more would need more
    executors, so fewer rows per core-second), said so in ``basis``."""
    best, ratio = _best_static(scaled, runs, "trainer_starvation_behind")
    if best is not None or scaled["trainer_starvation_behind"] is None:
        return best, ratio, "the best static count at no more starvation behind Kafka"
    measured = [n for n, r in runs.items() if r["trainer_starvation_behind"] is not None]
    if not measured:
        return None, None, "no static run measured its starvation"
    least = min(measured, key=lambda n: (runs[n]["trainer_starvation_behind"], -n))
    ratio = round(scaled["rows_per_core_second"] / runs[least]["rows_per_core_second"], 4)
    return least, ratio, "every static count starved more: the least starved, a lower bound"


def compare(args: argparse.Namespace, statics: list[int]) -> dict:
    """The scaled run (from 1 executor), then one static run per count in ``statics``, on one broker."""
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-kafka-"))
    server = mounted_server(work, kafka_classpath())  # the roles read it with the demo spec's connection
    server.start()
    try:
        scaled = one_run(args, 1, True, server)
        runs = {n: one_run(args, n, False, server) for n in statics}
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    best, ratio, basis = best_static_behind(scaled, runs)
    literal, ratio_literal = _best_static(scaled, runs, "trainer_starvation", STARVATION_NOISE)
    return {
        "ratio_real": ratio,
        "real_best_static_executors": best,
        "ratio_real_basis": basis,
        "cpu_util_real": scaled["cpu_util"],
        f"ratio_real_mean_starvation_within_{STARVATION_NOISE}": ratio_literal,
        f"real_best_static_executors_mean_starvation_within_{STARVATION_NOISE}": literal,
        "ratio_real_vs_each_static": {
            str(n): round(scaled["rows_per_core_second"] / r["rows_per_core_second"], 4) for n, r in runs.items()
        },
        "real_setup": {
            "base_rows_per_s": args.base,
            "factor": args.factor,
            "phases_s": [args.before, args.surge, args.after, args.tail],
            "row": {"sparse_string_features": args.sparse_strings, "dense_features": args.dense},
            "trainer_batch_size": args.batch_size,
            "executor_cpu": args.executor_cpu,
            "executors_bounds": [1, args.max_executors],
            "partitions": surge.PARTITIONS,
            "scaler_every_s": surge.SCALE_EVERY,
            "cooldown_s": args.cooldown,
            "step": args.step,
            "bound": "trainer_starvation_behind <= the scaled run's",
            "throughput": "stream rows trained per allotted stream-executor core-second",
        },
        "real_scaled": scaled,
        "real_static": {str(n): r for n, r in runs.items()},
    }
