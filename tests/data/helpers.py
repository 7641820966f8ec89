"""Tiny demo-layout data and job specs for the data-plane tests."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from primus_lib.spec.loader import job_from_document

DEMO = Path(__file__).resolve().parents[2] / "config" / "jobs" / "ctr-demo.yaml"
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def job_doc(data_uri: str, *, hours: int = 3, bootstrap: str = "127.0.0.1:19092", topic: str = "ctr-events") -> dict:
    doc = yaml.safe_load(DEMO.read_text())
    doc = copy.deepcopy(doc)
    doc["spec"]["timer"]["end"] = (T0 + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
    batch = doc["spec"]["dataset"]["streams"][0]
    batch["sources"][0]["uri"] = data_uri.rstrip("/") + "/impressions/{YYYY}{MM}{DD}/{HH}/"
    batch["sources"][1]["uri"] = data_uri.rstrip("/") + "/clicks/{YYYY}{MM}{DD}/{HH}/"
    batch["rows_per_shard"] = 100
    stream = doc["spec"]["dataset"]["streams"][1]
    stream["sources"][0]["kafka"].update(bootstrap_servers=bootstrap, topic=topic)
    return doc


def make_job(doc: dict, tmp_path: Path):
    doc = copy.deepcopy(doc)
    doc["spec"]["storage"] = {"root": str(tmp_path / "jobs")}
    return job_from_document(doc, env={})


def impressions(hour: datetime, rows: int, seed: int, part: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    base = int(hour.timestamp() * 1000)
    return pa.table({
        "request_id": [f"r{hour:%m%d%H}-{part}-{i}" for i in range(rows)],
        "user_id": rng.integers(0, 1000, rows),
        "item_id": rng.integers(0, 5000, rows),
        "category": rng.integers(0, 50, rows),
        "price": rng.random(rows) * 100,
        "age": rng.integers(18, 70, rows).astype(float),
        "ts": base + rng.integers(0, 3_600_000, rows),
    })  # fmt: skip


def clicks(imp: pa.Table, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    keep = rng.random(imp.num_rows) < 0.3
    ids = [r for r, k in zip(imp.column("request_id").to_pylist(), keep, strict=True) if k]
    return pa.table({"request_id": ids, "clicked": np.ones(len(ids), dtype=np.int64)})


def write_layout(
    root: Path, hours: int = 3, rows: int = 200, files: int = 2, marker: bool = True, start: datetime = T0
) -> dict:
    """The demo layout under ``root``; returns {(source, hour): rows}."""
    counts = {}
    for h in range(hours):
        hour = start + timedelta(hours=h)
        for source in ("impressions", "clicks"):
            (root / source / f"{hour:%Y%m%d}" / f"{hour:%H}").mkdir(parents=True, exist_ok=True)
        total_i = total_c = 0
        for p in range(files):
            imp = impressions(hour, rows, seed=h * 100 + p, part=p)
            clk = clicks(imp, seed=h * 100 + p + 7)
            pq.write_table(imp, root / "impressions" / f"{hour:%Y%m%d}" / f"{hour:%H}" / f"part-{p:03d}.parquet")
            pq.write_table(clk, root / "clicks" / f"{hour:%Y%m%d}" / f"{hour:%H}" / f"part-{p:03d}.parquet")
            total_i += imp.num_rows
            total_c += clk.num_rows
        if marker:
            for source in ("impressions", "clicks"):
                (root / source / f"{hour:%Y%m%d}" / f"{hour:%H}" / "_SUCCESS").touch()
        counts[("impressions", h)] = total_i
        counts[("clicks", h)] = total_c
    return counts
