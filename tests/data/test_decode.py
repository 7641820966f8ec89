from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import pytest

from primus_lib.data.schema import hash_buckets
from primus_lib.data.sources.decode import DecodeError, decode, to_epoch_ms
from tests.fixtures.specs import demo_doc, load

MS = 1_793_491_200_000  # 2026-11-01T00:00:00Z


@pytest.fixture
def job(tmp_path):
    return load(demo_doc(f"file://{tmp_path}/data", hours=3, rows_per_shard=100), storage=tmp_path / "jobs")


@pytest.mark.parametrize(
    "column",
    [
        pa.array([MS // 1000, MS // 1000 + 1]),
        pa.array([MS, MS + 1000]),
        pa.array([MS * 1000, (MS + 1000) * 1000]),
        pa.array([MS * 1_000_000, (MS + 1000) * 1_000_000]),
        pa.array(
            [datetime.fromtimestamp(MS / 1000), datetime.fromtimestamp(MS / 1000 + 1)], pa.timestamp("us", tz="UTC")
        ),
        pa.array(["2026-11-01T00:00:00Z", "2026-11-01T00:00:01Z"]),
    ],
    ids=["seconds", "ms", "us", "ns", "timestamp", "iso"],
)
def test_timestamps_become_epoch_ms(column):
    assert to_epoch_ms(column).to_pylist() == [MS, MS + 1000]


def test_decode_single_source_stream_maps_hashes_and_casts(job, tmp_path):
    stream = job.stream("realtime")
    source = stream.sources[0].model_copy(update={"columns": {"item_id": "item"}})
    raw = pa.table(
        {
            "request_id": ["a", "b"],
            "user_id": [5, 6],
            "item": ["x", "y"],
            "category": [1, 2],
            "price": [1.5, None],
            "age": [30, 40],
            "ts": [MS, MS + 1],
            "clicked": [1, 0],
            "junk": [0, 0],
        }
    )
    out = decode(job, stream, source, raw, "mem://x")
    assert out.schema.field("clicked").type == pa.float32()
    assert out.column("price").to_pylist() == [1.5, 0.0]
    assert out.column("item_id").to_pylist() == list(hash_buckets(np.array(["x", "y"], dtype=object), 100000))
    assert out.column("user_id").to_pylist() == list(hash_buckets(np.array([5, 6]), 100000))
    assert "junk" not in out.column_names
    assert all(0 <= v < 1000 for v in out.column("category").to_pylist())


def test_missing_required_column_names_file_and_column(job):
    stream = job.stream("realtime")
    raw = pa.table({"request_id": ["a"], "clicked": [1]})
    with pytest.raises(DecodeError, match=r"mem://f\.parquet: missing column 'ts'"):
        decode(job, stream, stream.sources[0], raw, "mem://f.parquet")


def test_joined_source_keeps_only_what_it_has(job):
    stream = job.stream("history")
    clicks = stream.sources[1]
    out = decode(job, stream, clicks, pa.table({"request_id": ["a"], "clicked": [1]}), "mem://c")
    assert out.column_names == ["request_id", "clicked"]
    with pytest.raises(DecodeError, match="missing column 'request_id'"):
        decode(job, stream, clicks, pa.table({"clicked": [1]}), "mem://c")
