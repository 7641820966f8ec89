"""The mixed-data priority rule: p_i = w_i * sigmoid(q_i), q in minibatches."""

from __future__ import annotations

import math

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from primus_lib.train.priority import Buffer, PriorityReader, priority


def _rows(n, start=0):
    return pa.table({"ts": list(range(start, start + n)), "x": list(range(n))})


def test_priority_formula():
    assert priority(2.0, 0, 10) == 1.0
    assert math.isclose(priority(1.0, 30, 10), 1 / (1 + math.exp(-3)))


@given(
    w1=st.floats(0.1, 10),
    w2=st.floats(0.1, 10),
    q1=st.integers(0, 5000),
    q2=st.integers(0, 5000),
)
def test_reader_picks_highest_priority_among_full_buffers(w1, w2, q1, q2):
    a, b = Buffer("a", "batch", w1, "ts"), Buffer("b", "stream", w2, "ts")
    a.push(_rows(q1))
    b.push(_rows(q2))
    reader = PriorityReader([a, b], batch_size=100)
    chosen = reader.choose()
    ready = [x for x in (a, b) if x.rows >= 100]
    if not ready:
        assert chosen is None
    else:
        best = max(ready, key=lambda x: priority(x.weight, x.rows, 100))
        assert chosen is not None and priority(chosen.weight, chosen.rows, 100) == priority(best.weight, best.rows, 100)


def test_stream_surge_drains_first_and_metrics():
    registry = CollectorRegistry()
    batch, stream = Buffer("history", "batch", 1.0, "ts"), Buffer("realtime", "stream", 4.0, "ts")
    batch.push(_rows(1000))
    stream.push(_rows(250, start=10_000))
    reader = PriorityReader([batch, stream], batch_size=100, registry=registry, clock=lambda: 20.0)
    order = []
    while (got := reader.next_minibatch()) is not None:
        order.append((got[0].name, got[1].num_rows))
    # the stream goes first while it holds a full minibatch; its 50-row remainder waits
    assert order[:2] == [("realtime", 100), ("realtime", 100)]
    assert [n for n, _ in order[2:]] == ["history"] * 10
    assert stream.rows == 50 and batch.rows == 0
    assert registry.get_sample_value("primus_trainer_rows_served_total", {"stream": "realtime"}) == 200
    assert registry.get_sample_value("primus_trainer_buffer_rows", {"stream": "realtime"}) == 50
    # newest served realtime event: ts 10_199 ms -> lag = 20 s - 10.199 s
    assert math.isclose(
        registry.get_sample_value("primus_trainer_event_lag_seconds", {"stream": "realtime"}), 20 - 10.199
    )
    stream.exhausted = True  # a finished source hands out its remainder
    name, rows = reader.next_minibatch()[0].name, stream.rows
    assert name == "realtime" and rows == 0


def test_equal_weights_prefer_the_longer_queue():
    a, b = Buffer("a", "batch", 1.0, "ts"), Buffer("b", "stream", 1.0, "ts")
    a.push(_rows(300))
    b.push(_rows(150))
    assert PriorityReader([a, b], batch_size=100).choose() is a
