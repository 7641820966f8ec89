"""The mixed-data priority rule: p_i = w_i * sigmoid(q_i), q in minibatches, as shares of rows."""

from __future__ import annotations

import math

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from primus_lib.train.runtime.priority import Buffer, PriorityReader, priority


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
def test_a_fresh_reader_picks_the_highest_priority_among_full_buffers(w1, w2, q1, q2):
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


def test_stream_surge_raises_the_streams_share_and_batch_never_starves():
    registry = CollectorRegistry()
    batch, stream = Buffer("history", "batch", 1.0, "ts"), Buffer("realtime", "stream", 4.0, "ts")
    batch.push(_rows(1000))
    stream.push(_rows(2050, start=10_000))  # a surge: twice the batch's rows, weight 4
    now = [20.0]
    reader = PriorityReader([batch, stream], batch_size=100, registry=registry, clock=lambda: now[0])
    assert registry.get_sample_value("primus_trainer_event_lag_seconds", {"stream": "realtime"}) is None
    order = []
    while (got := reader.next_minibatch()) is not None:
        order.append((got[0].name, got[1].num_rows))
    # while both hold rows, rows are drawn 4:1 (p = w * sigmoid(q), both queues saturated): the stream first
    first = [n for n, _ in order[:15]]
    assert first[0] == "realtime" and first.count("history") == 3
    assert "history" in first[:5]  # the batch is served during the surge, not after it
    assert sum(rows for _, rows in order) == 3000 and stream.rows == 50 and batch.rows == 0
    assert registry.get_sample_value("primus_trainer_rows_served_total", {"stream": "realtime"}) == 2000
    assert registry.get_sample_value("primus_trainer_buffer_rows", {"stream": "realtime"}) == 50
    # newest served realtime event: ts 11_999 ms -> lag = 20 s - 11.999 s
    assert math.isclose(
        registry.get_sample_value("primus_trainer_event_lag_seconds", {"stream": "realtime"}), 20 - 11.999
    )
    now[0] = 35.0  # read when collected: a trainer that stops serving falls behind
    assert math.isclose(
        registry.get_sample_value("primus_trainer_event_lag_seconds", {"stream": "realtime"}), 35 - 11.999
    )
    stream.exhausted = True  # a finished source hands out its remainder
    name, rows = reader.next_minibatch()[0].name, stream.rows
    assert name == "realtime" and rows == 0


@given(w=st.floats(0.05, 20), minibatches=st.integers(1, 200))
def test_rows_follow_the_priority_shares(w, minibatches):
    """With both buffers always full, each buffer's rows stay within one minibatch of its share."""
    a, b = Buffer("a", "batch", 1.0, "ts"), Buffer("b", "stream", w, "ts")
    reader = PriorityReader([a, b], batch_size=10)
    served = {"a": 0, "b": 0}
    for _ in range(minibatches):
        for buffer in (a, b):  # keep both saturated (q fixed at 100 minibatches)
            buffer.push(_rows(1000 - buffer.rows))
        buffer, rows = reader.next_minibatch()
        served[buffer.name] += rows.num_rows
    total = minibatches * 10
    share_b = w / (1.0 + w)
    assert abs(served["b"] - share_b * total) <= 10 + 1e-6
    assert abs(served["a"] - (1 - share_b) * total) <= 10 + 1e-6


def test_equal_weights_prefer_the_longer_queue():
    a, b = Buffer("a", "batch", 1.0, "ts"), Buffer("b", "stream", 1.0, "ts")
    a.push(_rows(300))
    b.push(_rows(150))
    assert PriorityReader([a, b], batch_size=100).choose() is a
