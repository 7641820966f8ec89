"""The real ScalingManager + policies on the pool model (primus_lib.scaling.simulation): a demand step
is served without overshoot, and the added executors are judged only on metrics that include them."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry

from primus_lib.scaling import ScalingManager
from primus_lib.scaling.horizontal import HEADROOM
from primus_lib.scaling.simulation import STARTUP_SECONDS, Load, ModelActuator, ModelReader, PoolModel
from tests.scaling.helpers import GIB, job

CORES = 4.0  # below PARALLELISM: every allocated core is usable


def scaled_pool(executors: int, load: Load, minutes: int) -> tuple[PoolModel, ModelActuator, list[float]]:
    spec = job(
        scaling={"vertical": {"enabled": False}},
        role={"replicas": executors, "min_replicas": 1, "max_replicas": 500, "cpu": CORES, "memory": "16Gi"},
    )
    model = PoolModel(executors, CORES, 16 * GIB)
    actuator = ModelActuator(model)
    manager = ScalingManager(
        spec, ModelReader(model, lambda: load), actuator, clock=lambda: model.now, registry=CollectorRegistry()
    )
    starved = []
    for _ in range(minutes):
        model.run(load, 60)
        starved.append(model.starved)
        manager.tick()
    return model, actuator, starved


def test_a_demand_step_is_served_with_headroom_and_without_overshoot():
    load = Load(cost=0.01, demand=10_000.0)  # 100 cores: 25 executors of 4 cores
    need = load.demand * load.cost / CORES
    model, actuator, starved = scaled_pool(18, load, 20)
    ups = [d for d in actuator.applied if d.action == "scale_up"]
    assert ups and starved[-1] == 0.0 and sum(starved[-5:]) == 0.0
    # the target the scale-up aims at is the need plus HEADROOM, never the (stale) gap counted twice
    assert need <= model.executors <= math.ceil(need * (1 + HEADROOM)) + 1, (model.executors, need)
    assert max(d.replicas for d in ups) <= math.ceil(need * (1 + HEADROOM)) + 1, [d.replicas for d in ups]


def test_arrived_executors_are_judged_on_metrics_that_include_them():
    load = Load(cost=0.01, demand=10_000.0)
    model, actuator, _ = scaled_pool(15, load, 12)
    ups = [d for d in actuator.applied if d.action == "scale_up"]
    # arrival at +STARTUP_SECONDS, then one interval of metrics with them: no decision in between
    for first, second in zip(ups, ups[1:], strict=False):
        assert second.at - first.at >= STARTUP_SECONDS + 60, [(d.at, d.replicas) for d in ups]
