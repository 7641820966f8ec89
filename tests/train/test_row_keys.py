"""Sample ids as 64-bit keys (row_keys.py): stable, independent of the minibatch around an id."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from primus_lib.train.model.batch import to_batch
from primus_lib.train.model.row_keys import KEY_COLUMN, NO_KEY, row_keys, with_keys
from tests.train.conftest import sample_rows


def test_keys_are_pinned_because_checkpoints_and_other_ranks_hold_them():
    """A change of the hash would silently orphan every checkpointed record: these values are the contract."""
    assert row_keys(["a", "0000001-00002a", "", "a" * 17]).tolist() == [
        7312617360686904206,
        16246074817245065768,
        3246858695411730098,
        16346657444640995807,
    ]
    assert row_keys(pa.array([0, 1, -5], pa.int64())).tolist() == [
        16294208416658607535,
        10451216379200822465,
        1635312068028924514,
    ]


def test_an_ids_key_does_not_depend_on_its_minibatch_or_its_arrow_layout():
    ids = ["0000001-00002a", "x", "", "ünïcode", "a\0b", "a" * 33]
    alone = [int(row_keys([i])[0]) for i in ids]
    assert row_keys(ids).tolist() == alone  # mixed lengths: each row its own words
    assert row_keys(["0000001-00002a", "0000001-00002b"]).tolist()[0] == alone[0]  # one length: the fast path
    plain = pa.array(ids * 3)
    for column in (
        plain.slice(6, 6),  # an offset into the buffers
        pa.chunked_array([plain.slice(0, 2), plain.slice(2, 4)]),
        plain.cast(pa.large_string()).slice(12, 6),
        pa.array([i.encode() for i in ids], pa.binary()),
        plain.slice(0, 6).dictionary_encode(),
        plain.slice(6, 6).cast(pa.string_view()),
    ):
        assert row_keys(column).tolist() == alone, column.type


def test_nulls_are_never_keys_and_other_types_are_refused_by_name():
    keys = row_keys(pa.array(["a", None, "b"]))
    assert keys[1] == NO_KEY and NO_KEY not in keys[[0, 2]]
    assert row_keys(pa.array([7, None], pa.int32())).tolist()[1] == NO_KEY
    assert row_keys(pa.array([7], pa.int32())).tolist() == row_keys(pa.array([7], pa.int64())).tolist()
    assert row_keys(pa.array(["7"])).tolist() != row_keys(pa.array([7])).tolist()
    with pytest.raises(
        TypeError, match=r"sample ids of type double: expected strings, binary or integers \(spec.features.id\)"
    ):
        row_keys(pa.array([1.5]))


def test_distinct_ids_get_distinct_keys():
    ids = [f"{h:07x}-{i:06x}" for h in range(20) for i in range(10_000)] + [str(i) for i in range(100_000)]
    keys = row_keys(ids)
    assert len(np.unique(keys)) == len(ids)
    assert (
        np.bincount((keys & np.uint64(0xFFFF)).astype(np.int64)).max() <= 25
    )  # the low bits (a table's buckets) spread: 4.6 a bin on average


def test_keys_hashed_as_rows_are_read_are_the_ones_a_minibatch_gets(tiny):
    """``with_keys`` tags a block of read rows with its ids' keys once; a minibatch cut from it reads
    them (``to_batch``) instead of hashing again, and they are the keys of its ids. A checkpoint's rows
    are hashed anew (``rehash``), and a trainer that needs no ids drops them, so every table of a buffer
    has the same columns."""
    _, job = tiny
    ids = [f"{i:07x}-{i:06x}" for i in range(700)]
    table = sample_rows(seed=3, ids=ids)
    keyed = with_keys(table, "request_id")
    assert keyed.column(KEY_COLUMN).to_numpy().tolist() == row_keys(ids).tolist()
    assert with_keys(keyed, "request_id") is keyed  # hashed once
    minibatch = to_batch(keyed.slice(512, 188), job.spec.features, "request_id")
    assert minibatch.keys is not None and minibatch.keys.tolist() == row_keys(ids[512:]).tolist()
    # the column is what the minibatch reads: a planted key comes through
    planted = keyed.set_column(keyed.schema.get_field_index(KEY_COLUMN), KEY_COLUMN, pa.array(range(700), pa.uint64()))
    assert to_batch(planted.slice(0, 4), job.spec.features, "request_id").keys.tolist() == [0, 1, 2, 3]
    assert with_keys(planted, "request_id", rehash=True).column(KEY_COLUMN).equals(keyed.column(KEY_COLUMN))
    assert with_keys(keyed, None).column_names == table.column_names  # no ids wanted: no keys
    assert with_keys(table.drop_columns(["request_id"]), "request_id").column_names == table.column_names[1:]
