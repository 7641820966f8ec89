"""The Dynamic Scaling Manager against the best static allocation, on a production-size job, over one day.

Trace: 8 trainers wanting 240k samples/s; the share of (costlier) stream samples follows a daily
traffic curve, with a one-hour stream surge (+35% stream share) at 20:00. The scaled run starts
from the hand-set 900 data executors x 10 cores and runs the real ScalingManager with the real
HorizontalPolicy + VerticalPolicy, configured by the *shipped* spec's `scaling` section
(config/jobs/ctr-demo.yaml), every `interval`, on the model of primus_lib.scaling.simulation
(executors use at most PARALLELISM cores each, added executors start after STARTUP_SECONDS).

Baseline: the best static allocation a user could have picked with hindsight of this very day:
a search over cores per executor (a coarse grid, then a fine one around its best) and, for each,
the fewest executors (bisection; starvation falls as executors are added) whose trainer starvation
is no worse than the scaled run's. Among those, the highest throughput per core wins.

Figures: core-hours allocated (pending pods hold their cores), CPU utilisation (used / allocated),
trainer starvation (share of the trainers' demand not served), throughput per core (samples per
allocated core-second). The paper: +17.1% throughput per core, CPU utilisation 50% -> 80%.
These are SIMULATED (the model above, the production policies): `ratio_sim`, `cpu_util_sim`.

Second phase, MEASURED (skipped with ``--skip-real``): the same comparison with real processes on the
embedded default (bench/_surge_runs.py: bench/surge.py's Kafka, stream executors of a fractional,
enforced CPU allotment decoding heavy rows, the MTRM trainer, a 10x surge; the scaler ticking vs every
fixed stream-executor count 1..N): `ratio_real` (stream rows trained per allotted executor
core-second, scaled / the best static at no more trainer starvation while rows waited in Kafka) and
`cpu_util_real` (the scaled executors' used / allotted CPU). The run fails (exit 1, after the JSON)
when the scaler made no scale-up or no scale-down: then it compared nothing.

Last line: JSON. `ratio` and `cpu_util` are the measured figures (`ratio_real`, `cpu_util_real`;
null with ``--skip-real``); `figures` says which key is measured and which simulated.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from primus_lib.scaling import ScalingManager
from primus_lib.scaling.simulation import PARALLELISM, ModelActuator, ModelReader, PoolModel, daily_load
from primus_lib.spec import PrimusJob, load_job

SHIPPED_SPEC = Path(__file__).resolve().parents[1] / "config" / "jobs" / "ctr-demo.yaml"
MINUTES = 24 * 60
TRAINERS, TRAINER_RATE = 8, 30_000.0
BATCH_COST, STREAM_COST = 0.012, 0.030  # core-seconds per sample (stream: JSON decode + join)
SURGE = (20 * 60, 21 * 60, 0.35)  # 20:00-21:00, +35% stream share
HAND_SET_EXECUTORS, HAND_SET_CORES, MEMORY = 900, 10.0, 24 * 2**30
MIN_EXECUTORS, MAX_EXECUTORS = 100, 1400  # the scaled role's bounds
COARSE_CORES = [float(c) for c in range(1, 11)]  # 1 .. 10 cores
FINE_STEP, FINE_SPAN = 0.1, 0.5  # then every 0.1 core within 0.5 of the coarse best (>= 1 core)
# the real phase (docs/scaling.md "Real processes"): executor-bound rows, stream executors of 0.15
# core (a cgroup quota where the machine has one), 1..4 of them (the topic's 4 partitions), the
# scaler every 5 s with a 10 s cooldown and the default step (stream executors reporting their rates
# are sized by them both ways; the step bounds only changes made without them)
REAL_PHASES, REAL_BASE = "20,20,70,10", 650.0
REAL_ROW = (4, 300)  # string-valued sparse features, dense features per event (~4.8 KB of JSON)
REAL_BATCH, REAL_EXECUTOR_CPU, REAL_MAX_EXECUTORS, REAL_COOLDOWN = 2048, 0.15, 4, 10.0


def job() -> PrimusJob:
    """The shipped demo spec (its `scaling` section as shipped) with a production-size executor role."""
    os.environ.setdefault("PRIMUS_DATA", tempfile.gettempdir())
    doc = load_job(SHIPPED_SPEC).model_dump(mode="json")
    doc["spec"]["resources"]["roles"]["data_executor"] = {
        "replicas": HAND_SET_EXECUTORS,
        "min_replicas": MIN_EXECUTORS,
        "max_replicas": MAX_EXECUTORS,
        "cpu": HAND_SET_CORES,
        "memory": MEMORY,
    }
    return PrimusJob.model_validate(doc)


def load_at(minute: int):
    return daily_load(
        minute,
        trainers=TRAINERS,
        trainer_rate=TRAINER_RATE,
        batch_cost=BATCH_COST,
        stream_cost=STREAM_COST,
        surge=SURGE,
    )


def run(executors: int, cores: float, spec: PrimusJob | None = None) -> dict:
    """One day on the model: static when ``spec`` is None, else scaled by the manager under ``spec``."""
    model = PoolModel(executors, cores, MEMORY)
    minute = 0
    actuator = ModelActuator(model)
    manager, every = None, 1
    if spec is not None:
        manager = ScalingManager(
            spec,
            ModelReader(model, lambda: load_at(minute)),
            actuator,
            clock=lambda: model.now,
            registry=CollectorRegistry(),
        )
        every = max(1, round(spec.spec.scaling.interval.total_seconds() / 60))
    core_seconds = used_core_seconds = trained = demanded = 0.0
    executors_seen, cores_seen = [], []
    for minute in range(MINUTES):
        load = load_at(minute)
        model.run(load, 60)
        allocated = (model.executors + sum(c for _, c in model.pending)) * model.cores  # pending pods hold cores
        core_seconds += allocated * 60
        used_core_seconds += model.used_cores * 60
        trained += model.trained
        demanded += load.demand * 60
        executors_seen.append(model.executors)
        cores_seen.append(model.cores)
        if manager is not None and minute % every == every - 1:
            manager.tick()
    return {
        "core_hours": round(core_seconds / 3600, 1),
        "cpu_utilisation": round(used_core_seconds / core_seconds, 4),
        "trainer_starvation": round(1 - trained / demanded, 5),
        "samples_trained": int(trained),
        "throughput_per_core": round(trained / core_seconds, 3),  # samples per allocated core-second
        "executors_min_max": [min(executors_seen), max(executors_seen)],
        "cores_min_max": [min(cores_seen), max(cores_seen)],
        "decisions": {a: sum(d.action == a for d in actuator.applied) for a in ("scale_up", "scale_down", "resize")},
        "oom_kills": model.oom_kills,
    }


def fewest_executors(cores: float, bound: float) -> tuple[int, dict] | None:
    """The fewest executors of ``cores`` each whose starvation is <= ``bound`` (None: none up to a cap)."""
    peak = max(load_at(m).demand * load_at(m).cost for m in range(MINUTES))  # cores the day needs at most
    lo = max(1, math.floor(0.5 * peak / min(cores, PARALLELISM)))
    hi = math.ceil(1.2 * peak / min(cores, PARALLELISM))
    best = run(hi, cores)
    if best["trainer_starvation"] > bound:
        return None
    while hi - lo > 1:  # invariant: hi meets the bound
        mid = (lo + hi) // 2
        result = run(mid, cores)
        if result["trainer_starvation"] <= bound:
            hi, best = mid, result
        else:
            lo = mid
    return hi, best


def best_static(bound: float) -> dict:
    """The static allocation with the highest throughput per core whose starvation is <= ``bound``."""
    searched: dict[float, tuple[int, dict] | None] = {}

    def scan(grid: list[float]) -> None:
        for cores in grid:
            cores = round(cores, 2)
            if COARSE_CORES[0] <= cores <= COARSE_CORES[-1] and cores not in searched:
                searched[cores] = fewest_executors(cores, bound)

    scan(COARSE_CORES)
    top = max((c for c, r in searched.items() if r), key=lambda c: searched[c][1]["throughput_per_core"])
    steps = round(FINE_SPAN / FINE_STEP)
    scan([top + FINE_STEP * i for i in range(-steps, steps + 1)])
    cores = max((c for c, r in searched.items() if r), key=lambda c: searched[c][1]["throughput_per_core"])
    executors, result = searched[cores]
    return {"executors": executors, "cores": cores, **result, "searched_cores": len(searched)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-real", action="store_true", help="only the model (no real-process runs)")
    parser.add_argument("--real-phases", default=REAL_PHASES, help="seconds: before, surge, after it, tail (real runs)")
    parser.add_argument("--real-base", type=float, default=REAL_BASE, help="base stream rows/s (x10 in the surge)")
    args = parser.parse_args(argv)
    logging.getLogger("primus.scaling").setLevel(logging.WARNING)
    spec = job()
    ours = run(HAND_SET_EXECUTORS, HAND_SET_CORES, spec)
    hand_set = run(HAND_SET_EXECUTORS, HAND_SET_CORES)
    static = best_static(ours["trainer_starvation"])
    # a static allocation that may starve as much as the hand-set one (the surge unserved), same cores
    lenient_at = fewest_executors(static["cores"], hand_set["trainer_starvation"])
    lenient = {"executors": lenient_at[0], "cores": static["cores"], **lenient_at[1]}
    sim = {
        "ratio_sim": round(ours["throughput_per_core"] / static["throughput_per_core"], 4),
        "cpu_util_sim": ours["cpu_utilisation"],
        "best_static": {"executors": static["executors"], "cores": static["cores"]},
        "starvation": {"scaled": ours["trainer_starvation"], "best_static": static["trainer_starvation"]},
        "cpu_util_best_static_sim": static["cpu_utilisation"],
        "ratio_sim_vs_hand_set_900x10": round(ours["throughput_per_core"] / hand_set["throughput_per_core"], 4),
        "ratio_sim_vs_static_at_hand_set_starvation": round(
            ours["throughput_per_core"] / lenient["throughput_per_core"], 4
        ),
        "search": {
            "cores": f"{COARSE_CORES[0]}..{COARSE_CORES[-1]} step 1, then step {FINE_STEP} within "
            f"{FINE_SPAN} of the best",
            "executors": "bisection per cores value",
            "bound": "starvation <= the scaled run's",
        },
        "scaling_spec": spec.spec.scaling.model_dump(mode="json"),
        "paper": {"throughput_per_core_gain_pct": 17.1, "cpu_utilisation": [0.50, 0.80]},
        "scaled": ours,
        "best_static_run": static,
        "hand_set_900x10": hand_set,
        "static_at_hand_set_starvation": lenient,
    }
    real = {} if args.skip_real else real_phase(args)
    result = {
        "bench": "scaling",
        "ratio": real.get("ratio_real"),
        "cpu_util": real.get("cpu_util_real"),
        "figures": {"ratio": "measured", "cpu_util": "measured", "ratio_sim": "simulated", "cpu_util_sim": "simulated"},
        **sim,
        **real,
    }
    print(json.dumps(result))
    if not args.skip_real:
        made = {d["action"] for d in real["real_scaled"]["decisions"]}
        missing = [a for a in ("scale_up", "scale_down") if a not in made]
        if missing:
            print(
                f"bench/scaling.py: the scaled real run made no {' and no '.join(missing)}: nothing was compared",
                file=sys.stderr,
            )
            sys.exit(1)


def real_phase(args: argparse.Namespace) -> dict:
    """The real-process comparison (bench/_surge_runs.py) on the workload above."""
    from bench import _surge_runs, surge

    before, during, after, tail = (float(x) for x in args.real_phases.split(","))
    real_args = surge.parser().parse_args(
        [
            "--base",
            str(args.real_base),
            "--before",
            str(before),
            "--surge",
            str(during),
            "--after",
            str(after),
            "--tail",
            str(tail),
            "--sparse-strings",
            str(REAL_ROW[0]),
            "--dense",
            str(REAL_ROW[1]),
            "--batch-size",
            str(REAL_BATCH),
            "--executor-cpu",
            str(REAL_EXECUTOR_CPU),
            "--max-executors",
            str(REAL_MAX_EXECUTORS),
            "--cooldown",
            str(REAL_COOLDOWN),
        ]
    )
    return _surge_runs.compare(real_args, list(range(1, REAL_MAX_EXECUTORS + 1)))


if __name__ == "__main__":
    main()
