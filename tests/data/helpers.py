"""Tiny demo-layout data for the data-plane tests (their specs: tests/fixtures/specs.py, demo_doc)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.fixtures.specs import T0


def impressions(hour: datetime, rows: int, seed: int, part: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    base = int(hour.timestamp() * 1000)
    return pa.table(
        {
            "request_id": [f"r{hour:%m%d%H}-{part}-{i}" for i in range(rows)],
            "user_id": rng.integers(0, 1000, rows),
            "item_id": rng.integers(0, 5000, rows),
            "category": rng.integers(0, 50, rows),
            "price": rng.random(rows) * 100,
            "age": rng.integers(18, 70, rows).astype(float),
            "ts": base + rng.integers(0, 3_600_000, rows),
        }
    )


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
