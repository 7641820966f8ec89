"""Load: a stream surge of 10x the normal rate while batch windows keep arriving. Is it drained by
the priority rule and the scaler, and does the batch side keep training?

    .venv/bin/python bench/surge.py [--base 500] [--factor 10] [--before 60] [--surge 60] [--after 120] [--tail 30]
                                    [--sparse-strings 0] [--executor-cpu 1]

Starts its own Apache Kafka (devstack.kafka) and runs the job's roles on the local backend as in
the embedded default: stream executors (``primus executor``, 1 replica, the scaler may take it to 4)
and the MTRM trainer (``primus train``, service mode, checkpoint every 50 steps). The bench
process plays the outside world and Airflow:
- a producer writes JSON events to the 4-partition topic at ``--base`` rows/s, then ``--factor``
  times that for ``--surge`` seconds, then the base rate again; ``--sparse-strings K`` makes each
  event heavier: K more categorical features with string ids (the executors parse and hash them, the
  trainer embeds them); ``--executor-cpu`` is the stream executors' allotment (a hard cap where the
  machine has a cgroup CPU controller: ``primus_lib.resources.cpu_quota``);
- a batch window (impressions left-join clicks) is planned, executed, joined and queued every
  ``--batch-every`` seconds in its own process (the DAG's data tasks: ``run_window``);
- the scaler ticks every 5 s (``scaling_step`` with the backend: the stream executors' replicas).
Sampled every 2 s: the Kafka high watermarks (sum over partitions) minus the stream rows the
trainer handed to training steps (``primus_trainer_rows_served_total{stream="realtime"}`` of its
metrics snapshot): the lag in rows; the batch rows served and batch windows consumed
(``trainer/progress.json``); the executors' buffer fill, the trainer's starved / back-pressure
ratios, the stream executor replicas and their own Kafka lag (``primus_executor_stream_lag_rows``,
what the scaler adds them on). Writes docs/img/surge-lag.png (``--plot``). Last line: JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devstack.kafka import KafkaServer, kafka_classpath, mounted_server  # noqa: E402
from primus_lib.data.datagen import generate  # noqa: E402
from primus_lib.paths import JobPaths  # noqa: E402
from primus_lib.progress import read_progress  # noqa: E402
from primus_lib.resources import backend_for  # noqa: E402
from primus_lib.scaling.step import scaling_step  # noqa: E402
from primus_lib.spec import load_job  # noqa: E402

PARTITIONS, TOPIC, SAMPLE_EVERY, SCALE_EVERY = 4, "surge-events", 2.0, 5.0
DEMO, T0 = ROOT / "config" / "jobs" / "ctr-demo.yaml", datetime(2026, 11, 1, tzinfo=UTC)
BODIES = 4096  # distinct event bodies the producer cycles through (encoded once: the producer stays cheap)
PY = [sys.executable, "-m", "primus_lib.cli.main"]
RUN_WINDOW = (
    "import sys; from primus_lib.spec import load_job; from primus_lib.timegrid import parse_utc; "
    "from primus_lib.data.executor import run_window; "
    "run_window(load_job(sys.argv[1]), 'history', parse_utc(sys.argv[2]), workers=1)"
)


def demo_doc(data_uri: str, hours: int, bootstrap: str, topic: str) -> dict:
    """The shipped demo job over ``hours`` windows from T0 of the data under ``data_uri`` and ``topic``."""
    doc = copy.deepcopy(yaml.safe_load(DEMO.read_text()))
    doc["spec"]["timer"]["end"] = (T0 + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
    batch, stream = doc["spec"]["dataset"]["streams"]
    for source in batch["sources"]:
        source["uri"] = f"{data_uri.rstrip('/')}/{source['name']}/{{YYYY}}{{MM}}{{DD}}/{{HH}}/"
    batch["rows_per_shard"] = 100
    stream["sources"][0]["kafka"].update(bootstrap_servers=bootstrap, topic=topic)
    return doc


def write_spec(
    work: Path,
    bootstrap: str,
    hours: int,
    rows_per_hour: int,
    replicas: int = 1,
    bounds: tuple[int, int] = (1, 4),
    topic: str = TOPIC,
    sparse_strings: int = 0,
    executor_cpu: float = 1.0,
    cooldown: float = 15.0,
    step: float = 0.25,
    dense: int = 0,
    batch_size: int = 256,
) -> Path:
    """The job's spec; ``replicas`` stream executors to start with, ``bounds`` the scaler's (min, max)."""
    data = work / "data"
    generate(data, T0, T0 + timedelta(hours=hours), rows_per_hour=rows_per_hour, seed=11)
    doc = demo_doc(f"file://{data}", hours, bootstrap, topic)
    doc["metadata"]["name"] = "surge"
    spec = doc["spec"]
    spec["dataset"]["streams"][1]["sources"][0]["kafka"].update(startup="earliest", group_id="surge-trainer")
    spec["features"]["sparse"] = [
        {"name": n, "buckets": b} for n, b in (("user_id", 10000), ("item_id", 10000), ("category", 100))
    ]
    spec["features"]["sparse"] += [{"name": f"tag{i}", "buckets": 1000} for i in range(sparse_strings)]
    spec["features"]["dense"] += [f"x{i}" for i in range(dense)]
    spec["dataset"]["streams"][0]["join"]["fill"].update({f"tag{i}": "none" for i in range(sparse_strings)})
    spec["model"] = {"embedding_dim": 8, "memory_tower": [32, 16], "adapt_tower": [16, 8]}
    spec["training"].update(batch_size=batch_size, priority={"history": 1.0, "realtime": 4.0})
    spec["storage"] = {"root": str(work / "jobs")}
    train = [*PY, "train", "{SPEC}", "--checkpoint-steps", "50", "--poll-interval", "1"]
    spec["resources"]["roles"] = {
        "data_executor": {"replicas": 1, "min_replicas": 1, "max_replicas": 1, "cpu": 1, "memory": "2Gi"},
        "stream_executor": {
            "replicas": replicas,
            "min_replicas": bounds[0],
            "max_replicas": bounds[1],
            "cpu": executor_cpu,
            "memory": "1Gi",
        },
        "trainer": {"replicas": 1, "cpu": 1, "memory": "4Gi", "command": train},
    }
    spec["scaling"] = {  # decided every SCALE_EVERY (the loop below): the executors report as often as it asks
        "interval": f"{SCALE_EVERY:g}s",
        "horizontal": {"enabled": True, "threshold": 0.5, "cooldown": f"{cooldown:g}s", "step": step},
        "vertical": {"enabled": False},
    }
    path = work / "surge.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def event_bodies(sparse_strings: int, dense: int = 0, seed: int = 5) -> list[bytes]:
    """JSON event bodies without their ``request_id`` and ``ts`` (the producer adds those)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(BODIES):
        event = {
            "user_id": int(rng.integers(0, 10**5)),
            "item_id": int(rng.integers(0, 10**4)),
            "category": int(rng.integers(0, 100)),
            "price": float(rng.random() * 100),
            "age": float(rng.integers(18, 70)),
            "clicked": int(rng.random() < 0.2),
        }
        event.update({f"tag{i}": f"t{i}-{int(rng.zipf(1.3)) % 50_000}" for i in range(sparse_strings)})
        event.update({f"x{i}": round(float(rng.random()), 4) for i in range(dense)})
        out.append(json.dumps(event).encode()[1:])  # without "{": the producer writes it with the ids
    return out


class Producer(threading.Thread):
    """Events at a rate that follows ``schedule`` [(seconds, rows/s), ...]; ``produced`` so far."""

    def __init__(
        self,
        client: dict[str, str],
        schedule: list[tuple[float, float]],
        topic: str = TOPIC,
        sparse_strings: int = 0,
        dense: int = 0,
    ) -> None:
        super().__init__(name="producer", daemon=True)
        from confluent_kafka import Producer as KafkaProducer

        self.producer = KafkaProducer({**client, "linger.ms": 20})
        self.schedule, self.produced, self.stop, self.topic = schedule, 0, threading.Event(), topic
        self.bodies = event_bodies(sparse_strings, dense)

    def rate_at(self, elapsed: float) -> float:
        for seconds, rate in self.schedule:
            if elapsed < seconds:
                return rate
            elapsed -= seconds
        return 0.0

    def run(self) -> None:
        began, owed, tick = time.monotonic(), 0.0, 0.1
        while not self.stop.is_set():
            elapsed = time.monotonic() - began
            rate = self.rate_at(elapsed)
            if rate == 0.0 and elapsed > sum(s for s, _ in self.schedule):
                break
            owed += rate * tick
            n, owed = int(owed), owed - int(owed)
            now_ms = int(time.time() * 1000)
            for i in range(n):
                k = self.produced + i
                head = b'{"request_id": "s%d", "ts": %d, ' % (k, now_ms)
                self.producer.produce(self.topic, head + self.bodies[k % BODIES], partition=k % PARTITIONS)
            self.produced += n
            self.producer.poll(0)
            time.sleep(max(0.0, began + elapsed + tick - time.monotonic()))
        self.producer.flush(30)


def prom_values(path: Path) -> dict[tuple[str, str], float]:
    """(metric name, stream or worker label) -> value of one snapshot file."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, str], float] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("stream", sample.labels.get("worker", "")))] = sample.value
    return out


class Sampler:
    def __init__(self, job, client: dict[str, str], backend, topic: str = TOPIC) -> None:
        from confluent_kafka import Consumer

        self.job, self.backend, self.paths, self.topic = job, backend, JobPaths.for_job(job), topic
        self.consumer = Consumer({**client, "group.id": "surge-watermarks"})
        self.rows: list[dict] = []
        self.highs: list[tuple[float, int]] = []  # (wall clock, high watermark): the lag at a snapshot's time

    def high_at(self, when: float) -> int:
        """The high watermark at wall-clock ``when``, interpolated between samples."""
        before = [(t, h) for t, h in self.highs if t <= when]
        after = [(t, h) for t, h in self.highs if t > when]
        if not before:
            return self.highs[0][1] if self.highs else 0
        if not after:
            return before[-1][1]
        (t0, h0), (t1, h1) = before[-1], after[0]
        return round(h0 + (h1 - h0) * (when - t0) / (t1 - t0))

    def high_watermark(self) -> int:
        from confluent_kafka import TopicPartition

        return sum(
            self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5)[1] for p in range(PARTITIONS)
        )

    def sample(self, elapsed: float, rate: float, windows_queued: int) -> dict:
        metrics = Path(self.paths.metrics_dir)  # the local job directory
        trainer = prom_values(metrics / "trainer-0.prom")
        fills = [
            v
            for f in metrics.glob("stream_executor-*.prom")
            for (name, _), v in prom_values(f).items()
            if name == "primus_executor_buffer_utilisation"
        ]
        lags = [
            v
            for f in metrics.glob("stream_executor-*.prom")
            for (name, _), v in prom_values(f).items()
            if name == "primus_executor_stream_lag_rows"
        ]
        progress = read_progress(self.paths.progress) if Path(self.paths.progress).exists() else {"consumed": {}}
        role = self.backend.status().roles.get("stream_executor")
        high = self.high_watermark()
        self.highs.append((time.time(), high))
        served = trainer.get(("primus_trainer_rows_served_total", "realtime"), 0.0)
        try:  # the trainer writes its snapshot at most every 5 s: compare it with the topic at that time
            written = (metrics / "trainer-0.prom").stat().st_mtime
        except OSError:
            written = time.time()
        row = {
            "t": round(elapsed, 1),
            "rate": rate,
            "produced": high,
            "stream_served": int(served),
            "lag_rows": self.high_at(written) - int(served),
            "lag_now": high - int(served),
            "batch_served": int(trainer.get(("primus_trainer_rows_served_total", "history"), 0)),
            "batch_windows_queued": windows_queued,
            "batch_windows_trained": sum(k.startswith("history/") for k in progress.get("consumed", {})),
            "executors_desired": role.desired if role else None,
            "executors_running": role.running if role else None,
            "executor_fill": round(float(np.mean(fills)), 3) if fills else None,
            "executor_lag": int(sum(lags)) if lags else None,  # their Kafka lag: what the scaler reads
            "trainer_starved": trainer.get(("primus_trainer_starved_ratio", "0")),
            "trainer_backpressure": trainer.get(("primus_trainer_backpressure_ratio", "0")),
        }
        self.rows.append(row)
        return row


def plot(rows: list[dict], decisions: list[dict], phases: tuple[float, float], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] for r in rows]
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for ax in (top, mid, low):
        ax.axvspan(*phases, color="orange", alpha=0.15, label="10x surge" if ax is top else None)
    top.plot(t, [r["lag_rows"] for r in rows], label="stream lag: Kafka high watermark - stream rows trained (rows)")
    top.set_ylabel("rows")
    top.legend(loc="upper right", fontsize=8)
    mid.plot(t, [r["batch_windows_trained"] for r in rows], label="batch windows trained")
    mid.plot(t, [r["batch_windows_queued"] for r in rows], "--", label="batch windows queued")
    mid.set_ylabel("windows")
    mid.legend(loc="upper left", fontsize=8)
    low.step(t, [r["executors_desired"] for r in rows], where="post", label="stream executors (desired)")
    for d in decisions:
        low.annotate(d["action"], (d["t"], d.get("replicas") or 0), fontsize=7, rotation=45)
    low.set_ylabel("executors")
    low.set_xlabel("seconds")
    low.legend(loc="upper left", fontsize=8)
    top.set_title("Stream surge: lag, batch progress and stream executors")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=float, default=500.0, help="normal stream rate, rows/s")
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--before", type=float, default=60.0, help="seconds at the base rate before the surge")
    parser.add_argument("--surge", type=float, default=60.0, help="seconds of surge")
    parser.add_argument("--after", type=float, default=120.0, help="seconds at the base rate after the surge")
    parser.add_argument("--tail", type=float, default=30.0, help="seconds sampled after the producer's schedule")
    parser.add_argument("--batch-every", type=float, default=15.0, help="seconds between batch windows")
    parser.add_argument("--batch-rows", type=int, default=2000, help="impressions per batch window")
    heavier = "more categorical features per event, string ids (heavier rows and decoding)"
    parser.add_argument("--sparse-strings", type=int, default=0, help=heavier)
    parser.add_argument("--dense", type=int, default=0, help="more dense features per event (heavier rows)")
    parser.add_argument("--batch-size", type=int, default=256, help="the trainer's minibatch rows")
    parser.add_argument("--executor-cpu", type=float, default=1.0, help="cores per stream executor (its allotment)")
    parser.add_argument("--max-executors", type=int, default=4, help="the scaler's bound (the topic's partitions)")
    parser.add_argument("--cooldown", type=float, default=15.0, help="seconds: the horizontal policy's cooldown")
    parser.add_argument("--step", type=float, default=0.25, help="the horizontal policy's largest change, a fraction")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "surge-lag.png")
    return parser


def run_surge(
    args: argparse.Namespace,
    replicas: int = 1,
    scale: bool = True,
    watch: Callable[[object, float], None] | None = None,
    server: KafkaServer | None = None,
) -> tuple[list[dict], list[dict], list[float]]:
    """One run: ``replicas`` stream executors to start with, the scaler ticking when ``scale`` (else the
    replicas stay fixed: the static allocation); ``watch(backend, elapsed)`` at every sample; its own
    Kafka unless ``server`` is given (then a topic of its own on it).
    Returns the samples, the scaler's decisions and when each batch window was queued."""
    total = args.before + args.surge + args.after
    hours = int(total // args.batch_every) + 2
    work = Path(tempfile.mkdtemp(prefix="bench-surge-"))
    owned = server is None
    if server is None:
        server = mounted_server(work, kafka_classpath())  # the roles read it with the demo spec's connection
        server.start()
    topic = TOPIC if owned else f"{TOPIC}-{work.name}"
    backend = None
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(server.client_config())
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(30)
        bounds = (1, args.max_executors) if scale else (replicas, replicas)
        spec = write_spec(
            work,
            server.bootstrap,
            hours,
            args.batch_rows,
            replicas,
            bounds,
            topic,
            args.sparse_strings,
            args.executor_cpu,
            args.cooldown,
            args.step,
            args.dense,
            args.batch_size,
        )
        job = load_job(spec, env={})
        backend = backend_for(job, str(spec))
        backend.submit()
        sampler = Sampler(job, server.client_config(), backend, topic)
        schedule = [(args.before, args.base), (args.surge, args.base * args.factor), (args.after, args.base)]
        producer = Producer(server.client_config(), schedule, topic, args.sparse_strings, args.dense)
        # warm-up: two batch windows (a window's last partial minibatch waits for the next one's rows)
        for hour in range(2):
            when = (T0 + timedelta(hours=hour)).isoformat()
            subprocess.run([sys.executable, "-c", RUN_WINDOW, str(spec), when], check=True, cwd=ROOT)
        deadline = time.monotonic() + 180
        while not Path(JobPaths.for_job(job).progress).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the trainer trained nothing in 180 s: {backend.status()}")
            time.sleep(1)
        producer.start()
        began, queued, decisions, queued_at = time.monotonic(), 2, [], [0.0, 0.0]
        next_batch, next_scale, next_sample, batch = began, began + SCALE_EVERY, began, None
        while (now := time.monotonic()) - began < total + args.tail:
            elapsed = now - began
            if batch is not None and batch.poll() is not None:
                if batch.returncode == 0:
                    queued += 1
                    queued_at.append(round(elapsed, 1))
                batch = None
            if batch is None and now >= next_batch and queued < hours:
                when = (T0 + timedelta(hours=queued)).isoformat()
                batch = subprocess.Popen([sys.executable, "-c", RUN_WINDOW, str(spec), when], cwd=ROOT)
                next_batch = now + args.batch_every
            if scale and now >= next_scale:
                for d in scaling_step(job, backend=backend):
                    decisions.append(
                        {
                            "t": round(elapsed, 1),
                            **{k: d.to_dict()[k] for k in ("role", "action", "replicas", "reason")},
                        }
                    )
                    print(f"{elapsed:6.1f}s decision {decisions[-1]}", flush=True)
                next_scale = now + SCALE_EVERY
            if now >= next_sample:
                row = sampler.sample(elapsed, producer.rate_at(elapsed), queued)
                if watch is not None:
                    watch(backend, elapsed)
                print(
                    f"{row['t']:6.1f}s rate {row['rate']:6.0f} lag {row['lag_rows']:6d} batch trained "
                    f"{row['batch_windows_trained']}/{queued} executors {row['executors_desired']}",
                    flush=True,
                )
                next_sample = now + SAMPLE_EVERY
            time.sleep(0.2)
        producer.stop.set()
        if batch is not None:
            batch.wait(60)
    finally:
        if backend is not None:
            backend.stop()
        if owned:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return sampler.rows, decisions, queued_at


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    rows, decisions, queued_at = run_surge(args)
    phases = (args.before, args.before + args.surge)
    plot(rows, decisions, phases, args.plot)
    print(json.dumps(summary(rows, decisions, phases, args, queued_at)))
    return 0


def _at(rows: list[dict], lo: float, hi: float) -> list[dict]:
    return [r for r in rows if lo <= r["t"] < hi]


def batch_latency(rows: list[dict], queued_at: list[float]) -> list[dict]:
    """Per batch window queued during the run: when it was queued and how long until the trainer
    had trained it (None: not by the end)."""
    out = []
    for k, at in enumerate(queued_at):
        done = next((r["t"] for r in rows if r["batch_windows_trained"] >= k + 1 and r["t"] >= at), None)
        out.append({"window": k, "queued_t": at, "trained_after_s": round(done - at, 1) if done is not None else None})
    return out


def summary(rows: list[dict], decisions: list[dict], phases: tuple[float, float], args, queued_at: list[float]) -> dict:
    before, surge = _at(rows, 0, phases[0]), _at(rows, *phases)
    after = _at(rows, phases[1], float("inf"))
    peak = max(rows, key=lambda r: r["lag_rows"])
    base_lag = max((r["lag_rows"] for r in before), default=0)
    drained = next((r["t"] for r in after if r["lag_rows"] <= max(base_lag, args.base * 5)), None)

    def trained(part: list[dict]) -> int:
        return part[-1]["batch_windows_trained"] - part[0]["batch_windows_trained"] if part else 0

    return {
        "bench": "surge",
        "base_rows_per_s": args.base,
        "factor": args.factor,
        "surge_s": [phases[0], phases[1]],
        "lag_before_max": base_lag,
        "lag_peak": peak["lag_rows"],
        "lag_peak_t": peak["t"],
        "drained_at_t": drained,
        "drain_s": round(drained - phases[1], 1) if drained is not None else None,
        "lag_end": rows[-1]["lag_rows"],
        "produced": rows[-1]["produced"],
        "batch_windows_trained": {"before": trained(before), "surge": trained(surge), "after": trained(after)},
        "batch_windows_queued": rows[-1]["batch_windows_queued"],
        "batch_latency": batch_latency(rows, queued_at),
        "executors_max": max((r["executors_desired"] or 0) for r in rows),
        "executors_max_by_phase": {
            name: max(((r["executors_desired"] or 0) for r in part), default=0)
            for name, part in (("before", before), ("surge", surge), ("after", after))
        },
        "executor_lag_max_by_phase": {
            name: max(((r["executor_lag"] or 0) for r in part), default=0)
            for name, part in (("before", before), ("surge", surge), ("after", after))
        },
        "decisions": decisions,
        "samples": rows,
    }


if __name__ == "__main__":
    sys.exit(main())
