from __future__ import annotations

import json

import numpy as np
import pytest

from primus_lib.data.sources import open_stream
from primus_lib.paths import JobPaths
from tests.data.helpers import T0, impressions
from tests.fixtures.specs import demo_doc, load, replay_stream


def _events(n: int, seed: int = 3) -> list[dict]:
    rows = impressions(T0, n, seed=seed).to_pylist()
    rng = np.random.default_rng(seed)
    for row in rows:
        row["clicked"] = int(rng.random() < 0.2)
    return rows


def _replay_job(tmp_path, uri: str, fmt: str = "jsonl"):
    doc = demo_doc(f"file://{tmp_path}/data", hours=3, rows_per_shard=100, stream=replay_stream(uri, format=fmt))
    return load(doc, storage=tmp_path / "jobs")


def test_replay_serves_events_in_event_time_order_and_dead_letters_bad_lines(tmp_path):
    events = _events(300)
    lines = [json.dumps(e) for e in events]
    lines.insert(10, "{not json")
    lines.insert(50, json.dumps({"request_id": "x", "clicked": 1}))  # no ts/user_id...
    lines.insert(70, "[1, 2]")
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    job = _replay_job(tmp_path, f"file://{path}")
    stream = job.stream("realtime")
    reader = open_stream(job, stream, stream.sources[0])
    ts = []
    while not reader.end_of_data():
        batch = reader.poll(64, 0.1)
        if batch is not None:
            ts.extend(batch.column("ts").to_pylist())
    assert len(ts) == 300 and ts == sorted(ts) == sorted(e["ts"] for e in events)
    assert reader.position() == {"replay/events": 300}
    assert reader.malformed == 3
    reader.close()
    dlq = JobPaths.for_job(job).root / "dlq" / "realtime" / "events.jsonl"
    letters = [json.loads(line) for line in dlq.read_text().splitlines()]
    assert [entry["origin"].rsplit(":", 1)[1] for entry in letters] == ["11", "51", "71"]
    assert "not JSON" in letters[0]["reason"] and "JSON object" in letters[2]["reason"]


def test_replay_resumes_from_a_position(tmp_path):
    events = _events(100)
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in events))
    job = _replay_job(tmp_path, f"file://{path}")
    stream = job.stream("realtime")
    first = open_stream(job, stream, stream.sources[0])
    head = first.poll(40, 0.1).column("request_id").to_pylist()
    rest_expected = first.poll(1000, 0.1).column("request_id").to_pylist()
    second = open_stream(job, stream, stream.sources[0])
    second.seek({"replay/events": 40})
    assert second.poll(1000, 0.1).column("request_id").to_pylist() == rest_expected
    assert len(head) == 40
    with pytest.raises(ValueError, match="cannot seek back"):
        second.seek({"replay/events": 0})


def test_stream_samples_have_the_full_sample_schema_even_without_keys(tmp_path):
    from primus_lib.data.schema import job_keys, sample_schema

    events = _events(5)
    for e in events:
        del e["request_id"], e["age"]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in events))
    job = _replay_job(tmp_path, f"file://{path}")
    stream = job.stream("realtime")
    batch = open_stream(job, stream, stream.sources[0]).poll(10, 0.1)
    assert batch.schema == sample_schema(job.spec.features, job_keys(job))
    assert batch.column("request_id").to_pylist() == [""] * 5 and batch.column("age").to_pylist() == [0.0] * 5
