"""The horizontal policy: the paper's rule, the starvation/back-pressure guards, the soundness
of the default weights for CPU and memory, shown on the pool model of primus_lib.scaling.simulation,
and the stream executors' rules (Kafka lag, saturation, their fixed costs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_lib.scaling.horizontal import (
    DEFAULT_WEIGHTS,
    STREAM_BUSY_CPU,
    STREAM_LAG_MIN_ROWS,
    STREAM_ROLE,
    HorizontalPolicy,
)
from primus_lib.scaling.simulation import Load, PoolModel
from primus_lib.spec import load_job
from primus_lib.spec.scaling import HorizontalScaling
from tests.scaling.helpers import context, history, snapshot

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [ROOT / "config" / "jobs" / "ctr-demo.yaml", ROOT / "config" / "k8s" / "ctr-demo-primusjob.yaml"]

POLICY = HorizontalPolicy(HorizontalScaling())


def test_spec_default_weights_are_the_policy_defaults():
    assert tuple(HorizontalScaling().weights) == DEFAULT_WEIGHTS


def test_dry_buffers_and_starved_trainer_add_executors():
    d = POLICY.decide(context(snapshot(buffer=0.02, cpu=0.95, memory=0.6, starved=0.1), replicas=40))
    assert d.action == "scale_up" and d.replicas == 47  # 40 / 0.9 = 44.4 needed, + 5% HEADROOM = 46.7
    d = POLICY.decide(context(snapshot(buffer=0.02, cpu=0.95, memory=0.6, starved=0.4), replicas=40))
    assert d.replicas == 50  # capped at step (25%) of the pool
    assert d.inputs["load"] < 0.5 and "starved" in d.reason


def test_never_adds_while_the_trainer_back_pressures_ray_45331():
    # buffers drained by a burst, but the trainer's own queue is full: it is the bottleneck
    assert POLICY.decide(context(snapshot(buffer=0.05, cpu=0.3, starved=0.1, backpressure=0.5))) is None


def test_no_add_without_starvation_and_none_while_executors_start():
    assert POLICY.decide(context(snapshot(buffer=0.05, cpu=0.9, starved=0.0))) is None
    assert POLICY.decide(context(snapshot(buffer=0.05, cpu=0.9, starved=0.015))) is None  # under STARVED_MIN
    assert POLICY.decide(context(snapshot(buffer=0.0, starved=0.3, executors=8), replicas=12)) is None


def test_full_buffers_and_back_pressure_remove_executors_by_estimated_need():
    snap = snapshot(buffer=1.0, cpu=0.4, memory=0.9, backpressure=1.0)
    # each executor uses 0.4 x 4 = 1.6 cores now and peaked at 3.2: half the pool (+5%) is enough
    d = POLICY.decide(context(snap, replicas=100, cpu=4.0, history=history([3.2, 3.0, 3.1])))
    assert d.action == "scale_down" and d.replicas == 75  # capped by step 0.25
    d = POLICY.decide(context(snap, replicas=100, cpu=4.0, history=history([1.7, 1.7])))
    assert d.replicas == 99  # 1.6 / 1.7 x 1.05 of the pool


def test_respects_bounds_and_dead_band():
    assert POLICY.decide(context(snapshot(buffer=0.0, starved=0.5), replicas=100, hi=100)) is None
    full = snapshot(buffer=1.0, cpu=0.2, backpressure=1.0)
    assert POLICY.decide(context(full, replicas=3, lo=3)) is None
    # L_u within threshold +- DEAD_BAND: hold
    assert POLICY.decide(context(snapshot(buffer=0.5, cpu=0.5, memory=0.5, starved=0.1))) is None


def steady_state(provision: float, memory_base: float) -> tuple:
    """The model's state after 10 minutes with executor capacity = provision x trainer demand."""
    load = Load(cost=0.01, demand=10_000.0)
    n = 100
    cores = provision * load.demand * load.cost / n
    model = PoolModel(n, cores, 8 * 2**30)
    for _ in range(10):
        model.run(load, 60)
    s = model.snapshot(load)
    return s.buffer, s.cpu, memory_base, s.trainer_starved, s.trainer_backpressure


@pytest.mark.parametrize("memory", [0.2, 0.5, 0.95])
@pytest.mark.parametrize("provision", [0.5, 0.7, 0.85, 0.9])
def test_default_weights_add_whenever_under_provisioned(provision, memory):
    """Under-provisioned pools have dry buffers and busy CPUs (often full memory): CPU and memory
    push L_u up, yet with w = [0.8, 0.1, 0.1] the rule still says add."""
    b, c, m, s, bp = steady_state(provision, memory)
    assert s > 0 and c > 0.9
    d = POLICY.decide(context(snapshot(buffer=b, cpu=c, memory=m, starved=s, backpressure=bp)))
    assert d is not None and d.action == "scale_up", (b, c, m, s)


@pytest.mark.parametrize("memory", [0.2, 0.5, 0.95])
@pytest.mark.parametrize("provision", [1.3, 1.6, 2.5])
def test_default_weights_remove_whenever_over_provisioned(provision, memory):
    b, c, m, s, bp = steady_state(provision, memory)
    d = POLICY.decide(
        context(
            snapshot(buffer=b, cpu=c, memory=m, starved=s, backpressure=bp),
            replicas=100,
            cpu=4.0,
            history=history([4.0, 4.0, 4.0]),
        )
    )
    assert d is not None and d.action == "scale_down", (b, c, m, s, bp)


def test_heavier_cpu_memory_weights_hold_while_the_trainer_starves():
    """Why not [0.6, 0.2, 0.2]: a starving pool at full CPU and memory reads L_u = 0.6 b + 0.4,
    inside the dead band for small b - it holds while the trainer waits."""
    heavy = HorizontalPolicy(HorizontalScaling(weights=[0.6, 0.2, 0.2]))
    snap = snapshot(buffer=0.1, cpu=1.0, memory=1.0, starved=0.15)
    assert heavy.decide(context(snap)) is None
    assert POLICY.decide(context(snap)).action == "scale_up"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_specs_add_while_the_trainer_starves(path, monkeypatch):
    """The configuration that ships (and that bench/scaling.py runs) must not be the starving one."""
    monkeypatch.setenv("PRIMUS_DATA", "/tmp")
    shipped = HorizontalPolicy(load_job(path).spec.scaling.horizontal)
    snap = snapshot(buffer=0.1, cpu=1.0, memory=1.0, starved=0.15)
    assert shipped.decide(context(snap)).action == "scale_up"


# -- stream executors: the lag says how far behind, their CPU how hard they work ------------------
STREAM = HorizontalPolicy(HorizontalScaling(step=1.0), STREAM_ROLE)  # bench/scaling.py's small pool


def stream(cpu: float, lag: float, starved: float = 0.9, **kw):
    return snapshot(buffer=0.0, cpu=cpu, memory=0.3, starved=starved, lag=lag, **kw)


def test_saturated_stream_executors_behind_kafka_grow_by_the_whole_step():
    # the trainer's wait read 0.12 with 125k rows in Kafka (it was training a batch window): sized
    # by that wait the pool grew 2 -> 3 -> 4, a decision and a cooldown late
    d = STREAM.decide(context(stream(cpu=0.99, lag=125_000, starved=0.12), replicas=2, hi=4, role=STREAM_ROLE))
    assert (d.action, d.replicas) == ("scale_up", 4)
    d = STREAM.decide(context(stream(cpu=0.99, lag=125_000, starved=0.12), replicas=3, hi=4, role=STREAM_ROLE))
    assert d.replicas == 4  # bounded by max_replicas
    quarter = HorizontalPolicy(HorizontalScaling(), STREAM_ROLE)  # the default step: a quarter of the pool
    d = quarter.decide(context(stream(cpu=0.99, lag=125_000, starved=0.12), replicas=8, hi=16, role=STREAM_ROLE))
    assert d.replicas == 10
    # not saturated (they idle behind Kafka: throttled elsewhere): the trainer's wait sizes it
    d = STREAM.decide(context(stream(cpu=0.5, lag=125_000, starved=0.12), replicas=2, hi=4, role=STREAM_ROLE))
    assert d.replicas == 3  # 2 / 0.88 x 1.05 = 2.4


def test_caught_up_stream_executors_shrink_to_what_their_work_needs():
    idle = stream(cpu=0.1, lag=200)  # 4 x 0.1 = 0.4 of an executor: one does it under STREAM_BUSY_CPU
    d = STREAM.decide(context(idle, replicas=4, hi=4, role=STREAM_ROLE))
    assert (d.action, d.replicas) == ("scale_down", 1) and "caught up with Kafka (200 rows behind)" in d.reason
    quarter = HorizontalPolicy(HorizontalScaling(), STREAM_ROLE)
    assert quarter.decide(context(idle, replicas=4, hi=4, role=STREAM_ROLE)).replicas == 3  # a quarter at a time


def test_executors_busy_with_their_fixed_costs_still_leave_one_at_a_time():
    # measured after a surge (bench/scaling.py): 4 executors at 73% of 0.15 core serving 650 rows/s
    # that one executor served at 77% before it; each pays its polls and Flight calls. By their CPU
    # alone all 4 are needed (4 x 0.73 / 0.85 = 3.4): the rule removes one anyway, lag would add it back
    assert 4 * 0.73 / STREAM_BUSY_CPU > 3
    d = STREAM.decide(context(stream(cpu=0.73, lag=145), replicas=4, hi=4, role=STREAM_ROLE))
    assert (d.action, d.replicas) == ("scale_down", 3)
    d = STREAM.decide(context(stream(cpu=0.77, lag=177), replicas=2, hi=4, role=STREAM_ROLE))
    assert d.replicas == 1


def test_busy_starting_or_lagging_stream_executors_are_kept():
    assert STREAM.decide(context(stream(cpu=STREAM_BUSY_CPU, lag=200), replicas=2, hi=4, role=STREAM_ROLE)) is None
    assert STREAM.decide(context(stream(cpu=0.1, lag=200), replicas=1, hi=4, role=STREAM_ROLE)) is None  # the minimum
    starting = stream(cpu=0.1, lag=200, executors=3)  # one of 4 asked for does not report yet
    assert STREAM.decide(context(starting, replicas=4, hi=4, role=STREAM_ROLE)) is None
    assert STREAM.decide(context(stream(cpu=0.1, lag=None), replicas=4, hi=4, role=STREAM_ROLE)) is None
    behind = STREAM.decide(context(stream(cpu=0.3, lag=STREAM_LAG_MIN_ROWS), replicas=2, hi=4, role=STREAM_ROLE))
    assert behind.action == "scale_up"
    batch = HorizontalPolicy(HorizontalScaling(step=1.0)).decide(context(stream(cpu=0.1, lag=200), replicas=4))
    assert batch.action == "scale_up"  # batch data executors: their rule (dry buffers, a starved trainer), not this
