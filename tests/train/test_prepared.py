"""Minibatches prepared ahead by the prefetch thread: the training buffers cut their rows on the
minibatch grid, a prepared minibatch is handed out only with exactly its rows, and rows stay in
the buffer (a checkpoint's pending rows) until served."""

from __future__ import annotations

import pyarrow as pa
import torch
from hypothesis import given
from hypothesis import strategies as st

from primus_lib.train.runtime.priority import Buffer, Piece, PriorityReader


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"ts": list(range(start, start + n))})


@given(pushes=st.lists(st.integers(0, 350), max_size=8), prepare_every=st.integers(1, 3))
def test_every_row_once_in_order_and_prepared_rows_match(pushes, prepare_every):
    buffer = Buffer("history", "batch", 1.0, "ts", align=100)
    reader = PriorityReader([buffer], batch_size=100)
    prepared_from: dict[int, list[int]] = {}

    def prepare(kind: str, piece: Piece) -> int:
        assert kind == "batch" and piece.table.num_rows == 100
        prepared_from[len(prepared_from)] = piece.table.column("ts").to_pylist()
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
            rows, piece = reader.take("history", 100)
            served += 1
            assert piece is not None  # on the grid: one piece, a cut of its pushed table
            assert piece.cut.view("ts").tolist() == rows.column("ts").to_pylist()  # the same rows, read there
            if (token := piece.prepared) is not None:  # what was prepared is exactly the rows served
                assert prepared_from[token] == rows.column("ts").to_pylist()
            taken += rows.column("ts").to_pylist()
        pending = buffer.pending()
        left = pending.column("ts").to_pylist() if pending is not None else []
        assert taken + left == list(range(pushed))  # nothing lost, nothing twice, in order
    buffer.exhausted = True
    if buffer.rows:
        rows, piece = reader.take("history", buffer.rows)  # the remainder: never prepared
        assert piece is None or piece.prepared is None
        assert rows.column("ts").to_pylist() == list(range(len(taken), pushed))
    assert reader.served == {"history": pushed}
    assert not step()  # served pieces are not prepared afterwards


def test_prepared_minibatches_follow_the_grid_across_pushes():
    buffer = Buffer("realtime", "stream", 1.0, "ts", align=100)
    reader = PriorityReader([buffer], batch_size=100)
    buffer.push(_rows(0, 130))
    buffer.push(_rows(130, 170))  # completes the 30-row tail: 300 rows, three full pieces
    seen: list[tuple[int, int]] = []
    step = reader.prepare_next(
        lambda kind, piece: seen.append((piece.table["ts"][0].as_py(), piece.cut.num_rows)) or piece
    )
    while step():
        pass
    assert seen == [(0, 100), (100, 100), (200, 100)]
    rows, piece = reader.take("realtime", 100)
    assert piece is not None and piece.prepared is piece and piece.table is rows and buffer.rows == 200
    # a take off the grid (a data-parallel rank's share) is served from the rows, not prepared
    rows, piece = reader.take("realtime", 60)
    assert piece is None and rows.column("ts").to_pylist() == list(range(100, 160))
    assert buffer.pending().column("ts").to_pylist() == list(range(160, 300))
    rows, piece = reader.take("realtime", 40)  # the rest of that piece: its cut starts past the 60 rows
    assert piece is not None and piece.prepared is None
    assert piece.cut.view("ts").tolist() == rows.column("ts").to_pylist() == list(range(160, 200))


def test_a_minibatch_read_from_its_pushed_table_equals_one_built_from_its_rows(tiny):
    """On the grid a minibatch reads its columns from the table its buffer was pushed (each column
    converted once, ``batch.Block``): the same tensors, ids, keys and windows as from its own rows, across a
    push that completed a tail (two chunks) and with nulls (filled with 0)."""
    from primus_lib.train.model.batch import to_batch
    from primus_lib.train.model.row_keys import with_keys
    from primus_lib.train.runtime.feeds import SEQ_COLUMN
    from primus_lib.train.runtime.windows import WindowAccounting
    from tests.train.conftest import sample_rows

    _, job = tiny
    rows = with_keys(sample_rows(250, seed=3), "request_id")
    user = rows.column("user_id").to_pylist()
    user[5] = user[130] = None
    rows = rows.set_column(rows.schema.get_field_index("user_id"), "user_id", pa.array(user, pa.int64()))
    rows = rows.append_column(SEQ_COLUMN, pa.array([1] * 120 + [2] * 130, pa.int64()))  # two windows' rows
    windows = WindowAccounting(3_600_000, stream_only=False)
    buffer = Buffer("history", "batch", 1.0, "ts", align=64)
    reader = PriorityReader([buffer], batch_size=64)
    buffer.push(rows.slice(0, 100))
    buffer.push(rows.slice(100))  # completes the 36-row tail: its table has two chunks
    served = 0
    while buffer.rows:
        got, piece = reader.take("history", min(64, buffer.rows))
        assert piece is not None
        cut, whole = (
            to_batch(piece.cut, job.spec.features, "request_id"),
            to_batch(got, job.spec.features, "request_id"),
        )
        assert whole.ids == rows.column("request_id").to_pylist()[served : served + got.num_rows]
        assert cut.ids == whole.ids and (cut.keys == whole.keys).all() and (cut.ts == whole.ts).all()
        assert torch.equal(cut.sparse.values(), whole.sparse.values()) and torch.equal(cut.dense, whole.dense)
        assert torch.equal(cut.labels, whole.labels) and cut.sparse.keys() == whole.sparse.keys()
        by_cut, by_rows = windows.parts("batch", piece.cut, cut.ts), windows.parts("batch", got, whole.ts)
        assert [(seq, None if mask is None else mask.tolist()) for seq, mask in by_cut] == [
            (seq, None if mask is None else mask.tolist()) for seq, mask in by_rows
        ]
        assert len(by_rows) == (2 if served < 120 < served + got.num_rows else 1)
        served += got.num_rows
    assert served == 250
