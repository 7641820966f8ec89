"""A tiny job over `primus datagen` data: committed batch windows and a JSONL stream replay."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from primus_lib.data.datagen import generate
from primus_lib.data.shards import write_window
from primus_lib.data.training_queue import TrainingQueue
from primus_lib.paths import JobPaths, window_id
from primus_lib.spec import load_job

START = datetime(2026, 11, 1, tzinfo=UTC)

SPEC = """\
apiVersion: primus.dev/v1alpha1
kind: PrimusJob
metadata: {{name: tiny}}
spec:
  timer: {{start: "2026-11-01T00:00:00Z", end: "2026-11-01T{hours:02d}:00:00Z", window: 1h}}
  dataset:
    streams:
      - name: history
        kind: batch
        lag: {lag}h
        sources:
          - {{name: impressions, uri: "file://${{PRIMUS_DATA}}/impressions/{{YYYY}}{{MM}}{{DD}}/{{HH}}/", format: parquet, success_marker: _SUCCESS}}
          - {{name: clicks, uri: "file://${{PRIMUS_DATA}}/clicks/{{YYYY}}{{MM}}{{DD}}/{{HH}}/", format: parquet, success_marker: _SUCCESS}}
        join: {{keys: [request_id], how: left, fill: {{clicked: 0}}}}
      - name: realtime
        kind: stream
        sources:
          - {{name: events, uri: "file://${{PRIMUS_DATA}}/stream/events.jsonl", format: jsonl}}
  features:
    label: clicked
    timestamp: ts
    id: request_id
    sparse: [{{name: user_id, buckets: 2000}}, {{name: item_id, buckets: 2000}}, {{name: category, buckets: 64}}]
    dense: [price, age]
  model: {{embedding_dim: 8, memory_tower: [32, 16], adapt_tower: [16, 8]}}
  training: {{mode: {mode}, batch_size: 64, learning_rate: 0.01, sparse_learning_rate: 0.1, priority: {{history: 1.0, realtime: 4.0}}}}
  resources:
    backend: local
    roles:
      trainer: {{replicas: 1, cpu: 1, memory: 1Gi}}
  scaling: {{horizontal: {{enabled: false}}, vertical: {{enabled: false}}}}
"""


def make_job(root: Path, monkeypatch, *, mode: str = "mtrm", hours: int = 6, lag: int = 2, rows: int = 150):
    data, home = root / "data", root / "home"
    monkeypatch.setenv("PRIMUS_DATA", str(data))
    monkeypatch.setenv("PRIMUS_HOME", str(home))
    spec = root / "tiny.yaml"
    spec.write_text(SPEC.format(hours=hours, lag=lag, mode=mode))
    if not (data / "stream" / "events.jsonl").exists():
        generate(data, START, START + timedelta(hours=hours), rows_per_hour=rows, seed=7)
    return spec, load_job(spec)


def kafka_spec(root: Path, monkeypatch, broker, topic: str, *, mode: str, batch_size: int = 64) -> Path:
    """The tiny spec with its stream read from a real Kafka topic instead of a replay file."""
    monkeypatch.setenv("PRIMUS_DATA", str(root / "data"))
    monkeypatch.setenv("PRIMUS_HOME", str(root / "home"))
    text = SPEC.format(hours=2, lag=1, mode=mode).replace(
        '{name: events, uri: "file://${PRIMUS_DATA}/stream/events.jsonl", format: jsonl}',
        f'{{name: events, kafka: {{bootstrap_servers: "{broker.bootstrap}", topic: {topic}, startup: earliest}}, format: json}}',
    )
    spec = root / "kafka.yaml"
    spec.write_text(text.replace("batch_size: 64", f"batch_size: {batch_size}"))
    return spec


def commit_windows(job, hours: range, rows_per_shard: int = 50) -> list[int]:
    """Commit batch windows the way the data plane's Sink does (shards + queue append)."""
    from primus_lib.evaluation.replay import batch_window

    paths = JobPaths.for_job(job)
    queue = TrainingQueue(paths.ledger)
    stream = job.stream("history")
    sizes = []
    for hour in hours:
        start = START + timedelta(hours=hour)
        table = batch_window(job, stream, start)
        directory = paths.window_dir(stream.name, start)
        write_window(
            directory, table, stream=stream.name, window=window_id(start), seed=0, rows_per_shard=rows_per_shard
        )
        queue.append(stream.name, window_id(start), str(directory), table.num_rows)
        sizes.append(table.num_rows)
    return sizes


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    spec, job = make_job(tmp_path, monkeypatch)
    return spec, job
