"""Sample ids as 64-bit keys (row_keys.py): stable, independent of the minibatch around an id."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from primus_lib.train.model.row_keys import NO_KEY, row_keys


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
