"""Stream executors are added only while they are behind their source (Kafka lag), not because a
source that only trickles leaves the trainer waiting: the policy's rule, the lag carried by every
metrics reader, and a real ``primus executor`` over a real Kafka scraped by a real Prometheus."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from primus_lib.data.executor.service_metrics import Cores, Rates
from primus_lib.data.flight_client import ExecutorStreamReader
from primus_lib.metrics import ExecutorMetrics, TrainerMetrics, write_snapshot
from primus_lib.metrics import names as n
from primus_lib.metrics.readers import PrometheusReader, RegistryReader, TextfileReader
from primus_lib.paths import JobPaths
from primus_lib.resources.discovery import LocalDiscovery
from primus_lib.scaling import ScalingManager
from primus_lib.scaling.horizontal import (
    CATCH_UP_SECONDS,
    STREAM_BUSY_CPU,
    STREAM_LAG_MIN_ROWS,
    STREAM_ROLE,
    HorizontalPolicy,
)
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


def test_stream_executors_behind_kafka_are_sized_by_their_measured_rates():
    # one executor at 0.95 CPU read 665 rows/s (700 when fully busy) while its partitions received
    # 6,465 rows/s, 39,000 rows behind: 6,465 + 39,000 / CATCH_UP_SECONDS rows/s to read
    busy = snapshot(**{**DRY, "cpu": 0.95}, lag=39_000)
    measured = dataclasses.replace(busy, read_rate=665.0, source_rate=6_465.0)
    wanted = math.ceil((6_465 + 39_000 / CATCH_UP_SECONDS) / 700 * 1.05)
    assert wanted == 10
    d = POLICY.decide(context(measured, replicas=1, hi=20, role=STREAM_ROLE))
    assert d.action == "scale_up" and d.replicas == wanted  # not one at a time (the default step: 1 of 1)
    assert POLICY.decide(context(measured, replicas=1, hi=4, role=STREAM_ROLE)).replicas == 4
    # an interval in which the surge began: less busy on average, read and received alike (the rates
    # carry it; a saturation gate on the CPU alone fell back to one at a time here)
    began = dataclasses.replace(measured, cpu=0.5, read_rate=350.0, source_rate=3_400.0)
    assert POLICY.decide(context(began, replicas=1, hi=20, role=STREAM_ROLE)).replicas == math.ceil(
        (3_400 + 39_000 / CATCH_UP_SECONDS) / 700 * 1.05
    )
    # without rates (an executor of an older release, or none read yet): the step, as before
    assert POLICY.decide(context(busy, replicas=1, hi=20, role=STREAM_ROLE)).replicas == 2
    idle = dataclasses.replace(busy, read_rate=0.0, source_rate=6_465.0)
    assert POLICY.decide(context(idle, replicas=1, hi=20, role=STREAM_ROLE)).replicas == 2


def test_an_executor_measures_its_source_over_the_partitions_it_kept():
    now = [0.0]
    rates = Rates(clock=lambda: now[0])
    assert rates.observe(0, {"0": 100, "1": 50}) is None  # the first observation: nothing to compare
    now[0] = 5.0
    assert rates.observe(2_000, {"0": 1_100, "1": 1_050}) == (400.0, 800.0)  # read 400/s, lag grew 400/s
    now[0] = 10.0
    assert rates.observe(4_000, {"0": 100, "1": 50}) == (400.0, 0.0)  # it caught up: received under read
    now[0] = 15.0
    assert rates.observe(5_000, {"0": 9_000}) == (200.0, 200.0)  # a rebalance: what was read only


def test_an_executor_reporting_every_second_measures_its_rates_and_cpu_over_five():
    # a job deciding every 5 s: its executors report every second, while each Kafka poll brings a
    # whole 4,096 rows (one every 2-3 s), so a one-second rate would read 0 or 4,096 rows/s
    now = [0.0]
    rates = Rates(clock=lambda: now[0])
    cpu = [0.0]
    cores = Cores(clock=lambda: now[0], cpu_seconds=lambda: cpu[0])
    read = {0: 0, 1: 4_096, 2: 4_096, 3: 8_192, 4: 8_192, 5: 8_192, 6: 12_288}
    busy = {0: 0.0, 1: 0.15, 2: 0.15, 3: 0.3, 4: 0.3, 5: 0.3, 6: 0.45}  # CPU-seconds: busy while it decodes a poll
    got = {}
    for t in range(7):
        now[0], cpu[0] = float(t), busy[t]
        got[t] = (rates.observe(read[t], {"0": 1_000 * t}), cores.observe())
    assert got[0] == (None, None)  # nothing to compare with yet
    assert got[1] == ((4_096.0, 5_096.0), pytest.approx(0.15))  # a first second: all there is
    assert got[2][0] == (2_048.0, 3_048.0)  # from the start while under five seconds
    assert got[5] == ((8_192 / 5, 8_192 / 5 + 1_000), pytest.approx(0.06))  # not the last second's 0
    # then from the newest observation at least five seconds old (t = 1), not from the start
    assert got[6] == (((12_288 - 4_096) / 5, (12_288 - 4_096) / 5 + 1_000), pytest.approx(0.06))


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


def test_caught_up_executors_reporting_rates_leave_in_one_decision():
    # a surge's 4 executors of 0.15 core, caught up: each 65% busy, mostly with its own polls and
    # metrics; they read 3,315 rows/s while their partitions received 1,425. At the surge's peak
    # they read 18,640 rows/s per busy allotted core (2,796 rows/s an executor)
    after = dataclasses.replace(snapshot(**{**DRY, "cpu": 0.65}, lag=82), read_rate=3_315.0, source_rate=1_425.0)
    remembered = dataclasses.replace(
        context(after, replicas=4, cpu=0.15, hi=4, role=STREAM_ROLE), read_capacity=18_640.0
    )
    assert math.ceil((1_425 + 82 / CATCH_UP_SECONDS) / (18_640 * 0.15) * 1.05) == 1
    d = POLICY.decide(remembered)  # the default step would remove one of the four
    assert d.action == "scale_down" and d.replicas == 1 and "1 can serve it" in d.reason
    bounded = dataclasses.replace(remembered, allocation=dataclasses.replace(remembered.allocation, min_replicas=2))
    assert POLICY.decide(bounded).replicas == 2
    # no busier interval remembered: this one's rate per busy executor (1,275 rows/s) sizes 2
    assert POLICY.decide(dataclasses.replace(remembered, read_capacity=None)).replicas == 2
    # the rates ask for all four, the CPU for three: at least one leaves, as without rates
    busier = dataclasses.replace(after, source_rate=4_000.0)
    assert POLICY.decide(context(busier, replicas=4, cpu=0.15, hi=4, role=STREAM_ROLE)).replicas == 3


def test_a_pool_that_has_just_read_its_backlog_leaves_by_its_rates_however_busy_it_was():
    # bench/scaling.py, the tick 20 s after a surge's scale-up: 4 executors of 0.15 core had read
    # their backlog (2,360 rows behind) at 95% CPU over the interval, 7,228 rows/s read while their
    # partitions received 1,485 (the surge had ended): one reads 1,898 rows/s fully busy
    drained = dataclasses.replace(
        snapshot(**{**DRY, "cpu": 0.952}, lag=2_360, executors=4), read_rate=7_228.0, source_rate=1_485.0
    )
    assert math.ceil((1_485 + 2_360 / CATCH_UP_SECONDS) / (7_228 / (4 * 0.952)) * 1.05) == 1
    d = POLICY.decide(context(drained, replicas=4, cpu=0.15, hi=4, role=STREAM_ROLE))
    assert (d.action, d.replicas) == ("scale_down", 1) and "95% CPU, their rates: 1 can serve it" in d.reason
    # as busy at a steady rate (read about what was received): the rates want all four, so all stay
    steady = dataclasses.replace(drained, read_rate=6_800.0, source_rate=7_000.0, stream_lag=300)
    assert POLICY.decide(context(steady, replicas=4, cpu=0.15, hi=4, role=STREAM_ROLE)) is None
    # busy and caught up at a steady rate, with a busier interval remembered (2,796 rows/s an
    # executor at a surge's peak): that peak, which these executors are not reaching, removes none
    remembered = dataclasses.replace(
        context(steady, replicas=4, cpu=0.15, hi=4, role=STREAM_ROLE), read_capacity=18_640.0
    )
    assert math.ceil(7_000 / (18_640 * 0.15) * 1.05) == 3
    assert POLICY.decide(remembered) is None
    # as busy without rates (an older executor): nothing says fewer would do
    unmeasured = dataclasses.replace(drained, read_rate=None, source_rate=None)
    assert POLICY.decide(context(unmeasured, replicas=4, cpu=0.15, hi=4, role=STREAM_ROLE)) is None


def test_batch_data_executors_keep_their_rule_without_any_lag():
    d = HorizontalPolicy(HorizontalScaling()).decide(context(snapshot(**DRY), replicas=4))
    assert d.action == "scale_up" and d.replicas == 5


def test_readers_sum_the_lag_of_the_roles_executors():
    registry = CollectorRegistry()
    for worker, lag in (("realtime-0", 100), ("realtime-1", 250)):
        m = ExecutorMetrics("lagjob", worker, 1, 2**30, role=STREAM_ROLE, registry=registry)
        m.observe_buffer(0, 10)
        m.observe_lag(lag)
        m.observe_rates(read=lag * 2, source=lag * 3)
    ExecutorMetrics("lagjob", "b0", 1, 2**30, registry=registry).observe_buffer(0, 10)  # a batch one: no lag
    stream = RegistryReader("lagjob", STREAM_ROLE, registry).snapshot()
    assert (stream.stream_lag, stream.read_rate, stream.source_rate) == (350, 700, 1050)
    batch = RegistryReader("lagjob", "data_executor", registry).snapshot()
    assert (batch.stream_lag, batch.read_rate, batch.source_rate) == (None, None, None)


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
    # Prometheus's scrape token beside the broker's login in the executors' mounted secret dir
    shutil.copy(prometheus_server.metrics_token_file, Path(os.environ["PRIMUS_SECRETS_DIR"]) / "metrics.token")
    executors(spec, 0, 1)  # no trainer attached yet: it reads nothing, all 6000 rows wait in Kafka
    prometheus_server.add_targets(name, [f"127.0.0.1:{port}"])
    metrics_dir = JobPaths.for_job(job).metrics_dir
    trainer = CollectorRegistry()
    TrainerMetrics(name, registry=trainer).observe_step(wait_seconds=0.9, total_seconds=1.0)  # starved
    write_snapshot(metrics_dir, "trainer-0", trainer)
    files = TextfileReader(name, metrics_dir, role=STREAM_ROLE)
    prom = PrometheusReader(prometheus_server.endpoint, name, STREAM_ROLE)

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
        read_rates: list[float] = []

        def lag_and_rate() -> float | None:
            snap = files.snapshot()
            read_rates.append((snap.read_rate or 0.0) if snap is not None else 0.0)
            return None if snap is None else snap.stream_lag

        _wait(lag_and_rate, 0, "lag once the trainer took everything")
        # the interval it read them in reports what it read (the source's rate beside it)
        _wait(lambda: lag_and_rate() is not None and max(read_rates) > 0, True, "the executor's read rate")
        assert files.snapshot().source_rate is not None
        prometheus_server.wait_for(f'{n.STREAM_LAG}{{primus_job="{name}"}} == 0', 1, timeout=60)
        write_snapshot(metrics_dir, "trainer-0", trainer)  # still starved: the source is quiet now
        assert files.snapshot().trainer_starved == pytest.approx(0.9)
        assert decide() is None  # at the live edge: another executor would idle
    finally:
        reader.close()
