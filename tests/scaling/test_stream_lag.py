"""Stream executors are added only while they are behind their source (Kafka lag), not because a
source that only trickles leaves the trainer waiting: the policy's rule, the lag carried by every
metrics reader, and a real ``primus executor`` over a real Kafka scraped by a real Prometheus."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from primus_lib.data.flight_client import ExecutorStreamReader
from primus_lib.metrics import ExecutorMetrics, TrainerMetrics, write_snapshot
from primus_lib.metrics import names as n
from primus_lib.metrics.readers import PrometheusReader, RegistryReader, TextfileReader
from primus_lib.paths import JobPaths
from primus_lib.resources.discovery import LocalDiscovery
from primus_lib.scaling import ScalingManager
from primus_lib.scaling.horizontal import STREAM_BUSY_CPU, STREAM_LAG_MIN_ROWS, STREAM_ROLE, HorizontalPolicy
from primus_lib.spec.scaling import HorizontalScaling
from tests.data.test_stream_executor import _produce, _pull, _spec, executors  # noqa: F401
from tests.fixtures._proc import free_port
from tests.scaling.helpers import context, snapshot

POLICY = HorizontalPolicy(HorizontalScaling(), STREAM_ROLE)
DRY = {"buffer": 0.0, "cpu": 0.3, "memory": 0.2, "starved": 0.9}  # empty buffers, a waiting trainer


def test_a_trickling_source_adds_no_stream_executor():
    at_the_edge = snapshot(**DRY, lag=STREAM_LAG_MIN_ROWS - 1)
    assert POLICY.decide(context(at_the_edge, replicas=1, hi=4, role=STREAM_ROLE)) is None
    assert POLICY.decide(context(snapshot(**DRY), replicas=1, hi=4, role=STREAM_ROLE)) is None  # lag not reported


def test_stream_executors_behind_kafka_are_added():
    d = POLICY.decide(context(snapshot(**DRY, lag=50_000), replicas=1, hi=4, role=STREAM_ROLE))
    assert d.action == "scale_up" and d.replicas == 2 and d.role == STREAM_ROLE
    assert "50000 rows behind Kafka" in d.reason and d.inputs["stream_lag"] == 50_000
    back_pressured = snapshot(**{**DRY, "starved": 0.1}, backpressure=0.5, lag=50_000)  # the trainer is the limit
    assert POLICY.decide(context(back_pressured, replicas=1, hi=4, role=STREAM_ROLE)) is None


def test_caught_up_stream_executors_leave_down_to_what_their_work_needs():
    quiet = snapshot(**{**DRY, "cpu": 0.1}, lag=200)  # a surge's executors, after it: 3 x 0.1 cores busy
    d = POLICY.decide(context(quiet, replicas=3, hi=4, role=STREAM_ROLE))  # the default step: 1 of 3
    assert d.action == "scale_down" and d.replicas == 2 and "caught up with Kafka (200 rows behind)" in d.reason
    busy = snapshot(**{**DRY, "cpu": STREAM_BUSY_CPU}, lag=200)  # each as busy as the rule keeps them
    assert POLICY.decide(context(busy, replicas=3, hi=4, role=STREAM_ROLE)) is None
    assert POLICY.decide(context(quiet, replicas=1, hi=4, role=STREAM_ROLE)) is None  # at min_replicas
    assert POLICY.decide(context(snapshot(**{**DRY, "cpu": 0.1}), replicas=3, hi=4, role=STREAM_ROLE)) is None
    calm = snapshot(buffer=0.0, cpu=0.1, memory=0.1, lag=200)  # batch executors: not this rule
    assert HorizontalPolicy(HorizontalScaling()).decide(context(calm, replicas=3)) is None


def test_batch_data_executors_keep_their_rule_without_any_lag():
    d = HorizontalPolicy(HorizontalScaling()).decide(context(snapshot(**DRY), replicas=4))
    assert d.action == "scale_up" and d.replicas == 5


def test_readers_sum_the_lag_of_the_roles_executors():
    registry = CollectorRegistry()
    for worker, lag in (("realtime-0", 100), ("realtime-1", 250)):
        m = ExecutorMetrics("lagjob", worker, 1, 2**30, role=STREAM_ROLE, registry=registry)
        m.observe_buffer(0, 10)
        m.observe_lag(lag)
    ExecutorMetrics("lagjob", "b0", 1, 2**30, registry=registry).observe_buffer(0, 10)  # a batch one: no lag
    assert RegistryReader("lagjob", STREAM_ROLE, registry).snapshot().stream_lag == 350
    assert RegistryReader("lagjob", "data_executor", registry).snapshot().stream_lag is None


class _Recorder:
    def __init__(self) -> None:
        self.applied: list = []

    def apply(self, decision) -> None:
        self.applied.append(decision)


def _wait(read, want, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while (got := read()) != want:
        assert time.monotonic() < deadline, f"{what}: {got}, wanted {want}"
        time.sleep(0.5)


@pytest.mark.integration
def test_a_real_executor_reports_its_lag_and_is_scaled_only_while_behind(
    kafka_broker,
    prometheus_server,
    tmp_path,
    monkeypatch,
    executors,  # noqa: F811
):
    topic = kafka_broker.new_topic(partitions=2)
    name, executors_role = f"lag-{topic}", {"replicas": 1, "min_replicas": 1, "max_replicas": 4}
    spec, job = _spec(tmp_path, kafka_broker, topic, name=name, roles={"stream_executor": executors_role})
    produced = _produce(kafka_broker, topic, 6000, 2, seed=41)
    port = free_port()
    monkeypatch.setenv("PRIMUS_METRICS_PORT", str(port))
    executors(spec, 0, 1)  # no trainer attached yet: it reads nothing, all 6000 rows wait in Kafka
    prometheus_server.add_targets(name, [f"127.0.0.1:{port}"])
    metrics_dir = JobPaths.for_job(job).metrics_dir
    trainer = CollectorRegistry()
    TrainerMetrics(name, registry=trainer).observe_step(wait_seconds=0.9, total_seconds=1.0)  # starved
    write_snapshot(metrics_dir, "trainer-0", trainer)
    files = TextfileReader(name, metrics_dir, role=STREAM_ROLE)
    prom = PrometheusReader(prometheus_server.url, name, STREAM_ROLE)

    def lag(reader) -> float | None:
        snap = reader.snapshot()
        return None if snap is None else snap.stream_lag

    def decide():
        policies = [HorizontalPolicy(job.spec.scaling.horizontal, STREAM_ROLE)]
        manager = ScalingManager(
            job, files, _Recorder(), role=STREAM_ROLE, policies=policies, registry=CollectorRegistry()
        )
        return manager.tick()

    _wait(lambda: lag(files), 6000, "lag in the executor's snapshot file")
    prometheus_server.wait_for(f'{n.STREAM_LAG}{{primus_job="{name}"}} == 6000', 1, timeout=60)
    assert lag(prom) == 6000
    behind = decide()
    assert behind is not None and (behind.action, behind.replicas) == ("scale_up", 2)
    assert "6000 rows behind Kafka" in behind.reason

    reader = ExecutorStreamReader(LocalDiscovery.for_stream(job, "realtime"), pull_rows=500)
    try:
        assert len(_pull(reader, len(produced))) == len(produced)
        _wait(lambda: lag(files), 0, "lag once the trainer took everything")
        prometheus_server.wait_for(f'{n.STREAM_LAG}{{primus_job="{name}"}} == 0', 1, timeout=60)
        write_snapshot(metrics_dir, "trainer-0", trainer)  # still starved: the source is quiet now
        assert files.snapshot().trainer_starved == pytest.approx(0.9)
        assert decide() is None  # at the live edge: another executor would idle
    finally:
        reader.close()
