"""The manager: one strategy at a time, cooldowns, decisions logged + exported + persisted."""

from __future__ import annotations

import dataclasses
import json
import logging

from prometheus_client import CollectorRegistry

from primus_lib.metrics.readers import MetricsReader
from primus_lib.scaling import ScalingManager, ScalingStore, executor_config, role_resources, scaling_dir
from tests.scaling.helpers import GIB, job, snapshot


class ScriptedReader(MetricsReader):
    """A test double: returns the snapshots it is given (no metrics server involved)."""

    def __init__(self, snaps):
        super().__init__("ctr-demo")
        self.snaps = list(snaps)

    def snapshot(self):
        return self.snaps.pop(0) if len(self.snaps) > 1 else self.snaps[0]


class Recorder:
    def __init__(self):
        self.applied = []

    def apply(self, decision):
        self.applied.append(decision)


def manager(snaps, clock, tmp_path=None, **kw):
    j = job(role={"replicas": 10, "min_replicas": 1, "max_replicas": 50, "cpu": 4, "memory": "8Gi"})
    store = ScalingStore(tmp_path) if tmp_path else None
    registry = CollectorRegistry()
    m = ScalingManager(j, ScriptedReader(snaps), Recorder(), clock=clock, registry=registry, store=store, **kw)
    return m, registry


def test_cooldown_and_one_strategy_at_a_time(tmp_path):
    now = [0.0]
    starving = snapshot(buffer=0.0, cpu=0.95, memory=0.5, starved=0.3, executors=10, cores=3.8, mem_bytes=5 * GIB)
    arrived = dataclasses.replace(starving, executors=13)  # the executors added at t=0 now report
    m, registry = manager([starving, starving, starving, arrived], lambda: now[0], tmp_path)
    first = m.tick()
    assert first.policy == "horizontal" and first.replicas == 13  # 10 + ceil(10 * .3/.7) capped at step
    now[0] = 30.0  # within the horizontal cooldown (60 s), and the new executors do not report yet
    assert m.tick() is None
    now[0] = 61.0  # past the cooldown, but 3 of the 13 executors still start: horizontal must wait;
    second = m.tick()  # the other strategy may act: memory to peak 5 GiB + 15% margin (cpu 4.37: < 25%)
    assert second is not None and (second.policy, second.action) == ("vertical", "resize")
    assert second.replicas is None and second.cpu == 4.0 and second.memory == int(5.75 * GIB)
    assert (
        registry.get_sample_value(
            "primus_scaling_decisions_total", {"primus_job": "ctr-demo", "policy": "horizontal", "action": "scale_up"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "primus_scaling_target", {"primus_job": "ctr-demo", "role": "data_executor", "resource": "replicas"}
        )
        == 13
    )
    now[0] = 90.0  # all 13 report and the trainer still starves, but the resize settles (120 s)
    assert m.tick() is None
    now[0] = 182.0
    third = m.tick()
    assert (third.policy, third.action, third.replicas) == ("horizontal", "scale_up", 17)  # 13 + ceil(13 / 4)
    records = ScalingStore(tmp_path).decisions()
    assert [(r["policy"], r["action"]) for r in records] == [
        ("horizontal", "scale_up"),
        ("vertical", "resize"),
        ("horizontal", "scale_up"),
    ]
    assert records[0]["inputs"]["trainer_starved"] == 0.3 and records[0]["inputs"]["load"] < 0.5


def test_vertical_waits_for_its_window_then_resizes_and_stores_resources(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path))
    now = [0.0]
    calm = snapshot(buffer=0.5, cpu=0.5, memory=0.5, executors=10, cores=2.0, mem_bytes=3 * GIB)
    m, _ = manager([calm], lambda: now[0], scaling_dir(job()))
    decisions = []
    for minute in range(6):
        now[0] = minute * 60.0
        decisions.append(m.tick())
    resize = [d for d in decisions if d is not None]
    assert len(resize) == 1 and resize[0].policy == "vertical"
    assert resize[0].cpu == 2.3 and resize[0].memory < 8 * GIB
    # the DAG's mapped tasks read the decision through executor_config (KubernetesExecutor)
    j = m.job
    assert role_resources(j, "data_executor") == (2.3, resize[0].memory)
    pod = executor_config(j)["pod_override"]
    assert pod.spec.containers[0].resources.requests["cpu"] == "2300m"
    # the state survives a new manager (the sensor runs as a fresh process each time)
    m2, _ = manager([calm], lambda: now[0] + 10, scaling_dir(job()))
    assert m2.allocation(m2.store.load()).cpu == 2.3


def test_oom_kill_acts_even_in_cooldown(tmp_path):
    now = [0.0]
    starving = snapshot(buffer=0.0, cpu=0.95, starved=0.3, executors=10, cores=3.0, mem_bytes=5 * GIB)
    oom = snapshot(buffer=0.0, cpu=0.95, starved=0.3, executors=13, cores=3.0, mem_bytes=5 * GIB, ooms=2)
    m, _ = manager([starving, oom], lambda: now[0], tmp_path)
    assert m.tick().policy == "horizontal"
    now[0] = 10.0
    d = m.tick()
    assert d.policy == "vertical" and d.memory == 12 * GIB


def test_every_decision_is_logged_with_inputs(tmp_path, caplog):
    starving = snapshot(buffer=0.0, cpu=0.95, starved=0.3, executors=10)
    m, _ = manager([starving], lambda: 0.0, tmp_path)
    with caplog.at_level(logging.INFO, logger="primus.scaling"):
        m.tick()
    record = json.loads(caplog.records[-1].getMessage().split(": ", 1)[1])
    assert record["policy"] == "horizontal" and record["inputs"]["buffer"] == 0.0


def test_state_and_decisions_on_s3_are_shared_by_scaler_runs_on_other_hosts(s3_env):
    """The scaler sensor runs on whichever worker Airflow picks: its cooldown clock, allocation and
    decision log live with the job's shared state (SeaweedFS here), not on one worker's disk."""
    import uuid

    from primus_lib.storage import StorageLocation, locate

    bucket = f"primus-{uuid.uuid4().hex[:8]}"
    s3_env.filesystem().create_dir(bucket)
    where = locate(f"s3://{bucket}/jobs/ctr-demo/scaling/data_executor")
    assert isinstance(where, StorageLocation)
    now = [0.0]
    starving = snapshot(buffer=0.0, cpu=0.95, memory=0.5, starved=0.3, executors=10, cores=3.8, mem_bytes=5 * GIB)
    first, _ = manager([starving], lambda: now[0], where)
    assert first.tick().replicas == 13
    now[0] = 30.0  # another worker, a fresh store object: the cooldown read from S3 still holds
    second, _ = manager([starving], lambda: now[0], locate(str(where)))
    assert second.tick() is None
    now[0] = 61.0
    assert second.tick() is not None
    records = ScalingStore(locate(str(where))).decisions()
    assert [r["policy"] for r in records] == ["horizontal", "vertical"]
    assert {"state.json", "decisions.jsonl"} <= {e.name for e in where.list()}


class _Seen:
    """A policy that only records the contexts it is shown."""

    name = "seen"

    def __init__(self):
        self.contexts = []

    def cooldown_seconds(self):
        return 0.0

    def settle_seconds(self):
        return 0.0

    def urgent(self, ctx):
        return False

    def decide(self, ctx):
        self.contexts.append(ctx)


def test_the_peak_read_rate_per_busy_core_is_remembered_over_the_look_back(tmp_path):
    # 4 executors 90% busy read 10,800 rows/s: 3,000 per busy executor; one 50% busy then reads
    # 650 rows/s (1,300): its fixed costs dilute the rate, the peak is kept (per allotted core)
    busy = dataclasses.replace(snapshot(cpu=0.9, executors=4), read_rate=10_800.0, source_rate=6_500.0)
    quiet = dataclasses.replace(snapshot(cpu=0.5, executors=1), read_rate=650.0, source_rate=650.0)
    silent = snapshot(cpu=0.5, executors=1)  # no rates reported
    now, seen = [0.0], _Seen()
    m, _ = manager([busy, quiet, silent, quiet], lambda: now[0], tmp_path, policies=[seen])
    per_core = 10_800 / (4 * 0.9 * 4.0)  # the role's executors have 4 cores
    for t in (0.0, 30.0, 60.0):
        now[0] = t
        m.tick()
    assert [c.read_capacity for c in seen.contexts] == [per_core, per_core, per_core]
    now[0] = 60.0 + 600.0  # the busy interval is past the look-back (spec.scaling.vertical.lookback)
    m.tick()
    assert seen.contexts[-1].read_capacity == 650 / (0.5 * 4.0)
