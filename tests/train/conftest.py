"""A tiny job over `primus datagen` data: committed batch windows and a JSONL stream replay."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_lib.data.datagen import generate
from primus_lib.data.shards import write_window
from primus_lib.data.training_queue import TrainingQueue
from primus_lib.paths import JobPaths, window_id
from primus_lib.spec import load_job
from primus_lib.train.model.batch import to_batch
from tests.fixtures.specs import T0 as START
from tests.fixtures.specs import job_doc, write_spec


def write_job(root: Path, monkeypatch, doc: dict, file: str = "tiny.yaml") -> Path:
    """``doc`` as ``root/file``, with PRIMUS_DATA and PRIMUS_HOME under ``root`` in the environment."""
    monkeypatch.setenv("PRIMUS_DATA", str(root / "data"))
    monkeypatch.setenv("PRIMUS_HOME", str(root / "home"))
    return write_spec(root / file, doc)


def make_job(root: Path, monkeypatch, *, hours: int = 6, rows: int = 150, **spec):
    """The tiny job (``job_doc(hours=hours, **spec)``) over datagen's data for its windows: (spec path, job)."""
    path = write_job(root, monkeypatch, job_doc(hours=hours, **spec))
    data = root / "data"
    if not (data / "stream" / "events.jsonl").exists():
        generate(data, START, START + timedelta(hours=hours), rows_per_hour=rows, seed=7)
    return path, load_job(path)


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


def minibatch(job, rows: int = 64, seed: int = 0, ids: list[str] | None = None, labels=None):
    """A model-ready minibatch of the tiny job's features: ``rows`` random rows (ids ``r0..``, random
    clicks), or the given ``ids`` and ``labels``."""
    return to_batch(sample_rows(rows, seed, ids, labels), job.spec.features, "request_id")


def sample_rows(rows: int = 64, seed: int = 0, ids: list[str] | None = None, labels=None) -> pa.Table:
    """``minibatch``'s rows, as the trainer reads them (Arrow)."""
    rng = np.random.default_rng(seed)
    n = len(ids) if ids is not None else rows
    clicked = rng.integers(0, 2, n).astype(np.float32) if labels is None else np.asarray(labels, np.float32)
    return pa.table(
        {
            "request_id": ids if ids is not None else [f"r{i}" for i in range(n)],
            "clicked": clicked,
            "ts": np.arange(n, dtype=np.int64),
            "user_id": rng.integers(0, 2000, n),
            "item_id": rng.integers(0, 2000, n),
            "category": rng.integers(0, 64, n),
            "price": rng.uniform(1, 50, n).astype(np.float32),
            "age": rng.uniform(18, 70, n).astype(np.float32),
        }
    )


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    spec, job = make_job(tmp_path, monkeypatch)
    return spec, job


def same_state(a, b) -> bool:
    """Nested state dicts equal, tensors by value (``==`` on a tensor is elementwise)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    return a == b
