"""Scaled vs static with real processes: bench/surge.py's scenario (its own Kafka, ``primus executor``
stream executors and ``primus train`` on the local backend, a 10x surge) run once with the scaler
ticking and once per fixed stream-executor count with no scaler at all (the static allocations).

Per run, over the sampled window (the producer's schedule and the tail): core-seconds of the stream
executors (allocated cores, the role's ``cpu``, x seconds each process was alive), the CPU-seconds they
used (psutil), the trainer's starvation (mean of ``primus_trainer_starved_ratio`` of its snapshot, as
surge.py samples it), stream rows trained and the lag. ``ratio_real`` = core-seconds of the best static
run (the fewest among those whose starvation is <= the scaled run's) / core-seconds of the scaled run.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import numpy as np
import psutil

from bench import surge

ROLE = "stream_executor"
# a second figure: static runs whose mean starvation is within this of the scaled run's also count
# (the spread between runs of one configuration on a loaded machine: a scaled run that made no
# decision, i.e. 1 executor like static 1, read 0.853 against static 1's 0.897)
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
        return {"core_seconds": round(core_seconds, 1), "used_cpu_seconds": round(used, 1),
                "processes": len(self.seen)}  # fmt: skip


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


def one_run(args: argparse.Namespace, replicas: int, scale: bool) -> dict:
    executors, trainer = RoleUsage(ROLE), RoleUsage("trainer")
    rows, decisions, queued_at = surge.run_surge(args, replicas, scale,
                                                 lambda b, t: (executors(b, t), trainer(b, t)))  # fmt: skip
    phases = (args.before, args.before + args.surge)
    brief = surge.summary(rows, decisions, phases, args, queued_at)
    in_surge = [r for r in rows if phases[0] <= r["t"] < phases[1]]
    return {
        "executors": f"scaled from {replicas}" if scale else f"static {replicas}",
        **executors.figures(),
        "trainer_used_cpu_seconds": trainer.figures()["used_cpu_seconds"],
        "trainer_starvation": _mean([r["trainer_starved"] for r in rows]),
        "trainer_starvation_surge": _mean([r["trainer_starved"] for r in in_surge]),
        "stream_rows_trained": rows[-1]["stream_served"] - rows[0]["stream_served"],
        "window_s": rows[-1]["t"],
        **{k: brief[k] for k in ("lag_peak", "drain_s", "lag_end", "executors_max", "executor_lag_max_by_phase")},
        "decisions": [{k: d[k] for k in ("t", "action", "replicas")} for d in decisions],
    }


def _best_static(scaled: dict, runs: dict[int, dict], tolerance: float) -> tuple[int | None, float | None]:
    """(executors, core-seconds ratio) of the cheapest static run starving at most ``tolerance`` more."""
    bound = scaled["trainer_starvation"]
    meeting = [
        n for n, r in runs.items() if bound is not None and (r["trainer_starvation"] or 1.0) <= bound + tolerance
    ]
    if not meeting:
        return None, None
    best = min(meeting, key=lambda n: runs[n]["core_seconds"])
    return best, round(runs[best]["core_seconds"] / scaled["core_seconds"], 4)


def compare(args: argparse.Namespace, statics: list[int]) -> dict:
    """The scaled run, then one static run per count in ``statics``; ``ratio_real`` (None when no
    static run starved no more than the scaled one)."""
    scaled = one_run(args, 1, scale=True)
    runs = {n: one_run(args, n, scale=False) for n in statics}
    best, ratio = _best_static(scaled, runs, 0.0)
    best_tolerant, ratio_tolerant = _best_static(scaled, runs, STARVATION_NOISE)
    return {
        "ratio_real": ratio,
        "real_best_static_executors": best,
        f"ratio_real_starvation_within_{STARVATION_NOISE}": ratio_tolerant,
        f"real_best_static_executors_within_{STARVATION_NOISE}": best_tolerant,
        "real_setup": {
            "base_rows_per_s": args.base,
            "factor": args.factor,
            "phases_s": [args.before, args.surge, args.after, args.tail],
            "executor_cpu": 1,
            "scaler_every_s": surge.SCALE_EVERY,
            "bound": "mean trainer starvation <= the scaled run's",
        },  # fmt: skip
        "real_scaled": scaled,
        "real_static": {str(n): r for n, r in runs.items()},
    }
