"""Static allocation vs the Dynamic Scaling Manager on a production-size job, over one day.

Trace: 8 trainers wanting 240k samples/s; the share of (costlier) stream samples follows a daily
traffic curve, with a one-hour stream surge at 20:00. The hand-set static allocation is 900 data
executors x 10 cores (it covers the normal daily peak). The scaling manager starts from the same
allocation and runs the real HorizontalPolicy + VerticalPolicy (primus_lib.scaling) through the
real ScalingManager every minute, on the model of primus_lib.scaling.simulation (executors use
at most 5.2 cores each, added executors start after 2 minutes).

Figures: core-hours allocated, CPU utilisation (used / allocated), trainer starvation (share of
trainer time without data), samples trained, throughput per core (samples / allocated
core-second). The paper: +17.1% throughput per core, CPU utilisation 50% -> 80%. A second
baseline, static 900 x 6 cores (what the vertical policy settles on), separates the horizontal gain.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from primus_lib.scaling import ScalingManager
from primus_lib.scaling.simulation import ModelActuator, ModelReader, PoolModel, daily_load
from primus_lib.spec import PrimusJob, load_job

MINUTES = 24 * 60
TRAINERS, TRAINER_RATE = 8, 30_000.0
BATCH_COST, STREAM_COST = 0.012, 0.030  # core-seconds per sample (stream: JSON decode + join)
SURGE = (20 * 60, 21 * 60, 0.35)  # 20:00-21:00, +35% stream share
STATIC_EXECUTORS, STATIC_CORES, STATIC_MEMORY = 900, 10.0, 24 * 2**30


def job() -> PrimusJob:
    os.environ.setdefault("PRIMUS_DATA", tempfile.gettempdir())
    doc = load_job(Path(__file__).resolve().parents[1] / "config" / "jobs" / "ctr-demo.yaml").model_dump(mode="json")
    doc["spec"]["resources"]["roles"]["data_executor"] = {
        "replicas": STATIC_EXECUTORS, "min_replicas": 100, "max_replicas": 1400,
        "cpu": STATIC_CORES, "memory": STATIC_MEMORY,
    }  # fmt: skip
    doc["spec"]["scaling"] = {}  # the policies' defaults
    return PrimusJob.model_validate(doc)


def load_at(minute: int):
    return daily_load(minute, trainers=TRAINERS, trainer_rate=TRAINER_RATE, batch_cost=BATCH_COST,
                      stream_cost=STREAM_COST, surge=SURGE)  # fmt: skip


def run(scaled: bool, cores: float = STATIC_CORES) -> dict:
    model = PoolModel(STATIC_EXECUTORS, cores, STATIC_MEMORY)
    minute = 0
    manager = None
    actuator = ModelActuator(model)
    if scaled:
        manager = ScalingManager(job(), ModelReader(model, lambda: load_at(minute)), actuator,
                                 clock=lambda: model.now, registry=CollectorRegistry())  # fmt: skip
    core_seconds = used_core_seconds = trained = demanded = starved_minutes = 0.0
    executors_seen, cores_seen = [], []
    for minute in range(MINUTES):
        load = load_at(minute)
        model.run(load, 60)
        allocated = (model.executors + sum(c for _, c in model.pending)) * model.cores  # pending pods hold cores
        core_seconds += allocated * 60
        used_core_seconds += model.used_cores * 60
        trained += model.trained
        demanded += load.demand * 60
        starved_minutes += model.starved
        executors_seen.append(model.executors)
        cores_seen.append(model.cores)
        if manager is not None:
            manager.tick()
    core_hours = core_seconds / 3600
    return {
        "core_hours": round(core_hours, 1),
        "cpu_utilisation": round(used_core_seconds / core_seconds, 4),
        "trainer_starvation": round(1 - trained / demanded, 4),
        "starved_minutes": round(starved_minutes, 1),
        "samples_trained": int(trained),
        "throughput_per_core": round(trained / core_seconds, 3),  # samples per allocated core-second
        "executors_min_max": [min(executors_seen), max(executors_seen)],
        "cores_per_executor_final": cores_seen[-1],
        "decisions": len(actuator.applied),
        "decisions_by_action": {
            a: sum(d.action == a for d in actuator.applied) for a in ("scale_up", "scale_down", "resize")
        },
        "oom_kills": model.oom_kills,
    }


def main() -> None:
    logging.getLogger("primus.scaling").setLevel(logging.WARNING)
    static = run(scaled=False)
    static_6 = run(scaled=False, cores=6.0)  # a second baseline: static, but with the 6 cores the vertical policy finds
    ours = run(scaled=True)
    result = {
        "bench": "scaling",
        "ratio": round(ours["throughput_per_core"] / static["throughput_per_core"], 4),
        "ratio_vs_static_6_cores": round(ours["throughput_per_core"] / static_6["throughput_per_core"], 4),
        "throughput_per_core_gain_pct": round(
            100 * (ours["throughput_per_core"] / static["throughput_per_core"] - 1), 1
        ),
        "cpu_utilisation": {"static": static["cpu_utilisation"], "scaled": ours["cpu_utilisation"]},
        "core_hours_saved_pct": round(100 * (1 - ours["core_hours"] / static["core_hours"]), 1),
        "paper": {"throughput_per_core_gain_pct": 17.1, "cpu_utilisation": [0.50, 0.80]},
        "static": static,
        "static_6_cores": static_6,
        "scaled": ours,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
