"""Minibatches prepared ahead by the prefetch thread: the training buffers cut their rows on the
minibatch grid, a prepared minibatch is handed out only with exactly its rows, and rows stay in
the buffer (a checkpoint's pending rows) until served."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from primus_lib.train.runtime.priority import Buffer, PriorityReader


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"ts": list(range(start, start + n))})


@given(pushes=st.lists(st.integers(0, 350), max_size=8), prepare_every=st.integers(1, 3))
def test_every_row_once_in_order_and_prepared_rows_match(pushes, prepare_every):
    buffer = Buffer("history", "batch", 1.0, "ts", align=100)
    reader = PriorityReader([buffer], batch_size=100)
    prepared_from: dict[int, list[int]] = {}

    def prepare(kind: str, rows: pa.Table) -> int:
        assert kind == "batch" and rows.num_rows == 100
        prepared_from[len(prepared_from)] = rows.column("ts").to_pylist()
        return len(prepared_from) - 1

    step = reader.prepare_next(prepare)
    pushed = served = 0
    taken: list[int] = []
    for i, n in enumerate(pushes):
        buffer.push(_rows(pushed, n))
        pushed += n
        if i % prepare_every == 0:
            while step():
                pass
        while buffer.rows >= 100:
            rows, token = reader.take("history", 100)
            served += 1
            if token is not None:  # what was prepared is exactly the rows served
                assert prepared_from[token] == rows.column("ts").to_pylist()
            taken += rows.column("ts").to_pylist()
        pending = buffer.pending()
        left = pending.column("ts").to_pylist() if pending is not None else []
        assert taken + left == list(range(pushed))  # nothing lost, nothing twice, in order
    buffer.exhausted = True
    if buffer.rows:
        rows, token = reader.take("history", buffer.rows)  # the remainder: never prepared
        assert token is None and rows.column("ts").to_pylist() == list(range(len(taken), pushed))
    assert reader.served == {"history": pushed}
    assert not step()  # served pieces are not prepared afterwards


def test_prepared_minibatches_follow_the_grid_across_pushes():
    buffer = Buffer("realtime", "stream", 1.0, "ts", align=100)
    reader = PriorityReader([buffer], batch_size=100)
    buffer.push(_rows(0, 130))
    buffer.push(_rows(130, 170))  # completes the 30-row tail: 300 rows, three full pieces
    seen: list[tuple[int, int]] = []
    step = reader.prepare_next(lambda kind, rows: seen.append((rows["ts"][0].as_py(), rows.num_rows)) or rows)
    while step():
        pass
    assert seen == [(0, 100), (100, 100), (200, 100)]
    rows, prepared = reader.take("realtime", 100)
    assert prepared is rows and buffer.rows == 200
    # a take off the grid (a data-parallel rank's share) is served from the rows, not prepared
    rows, prepared = reader.take("realtime", 60)
    assert prepared is None and rows.column("ts").to_pylist() == list(range(100, 160))
    assert buffer.pending().column("ts").to_pylist() == list(range(160, 300))
