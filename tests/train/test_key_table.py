"""The row-key table (key_table.py) against a dict, one minibatch at a time. Its keys are hashes
(row_keys.py): spread over the low bits that pick a bucket."""

from __future__ import annotations

import numpy as np
import pytest

from primus_lib.train.model.key_table import ABSENT, KeyTable


@pytest.mark.parametrize(("ids", "low_bits"), [(200, 3), (3_000, 64)])
def test_the_table_does_what_a_dict_does(ids, low_bits):
    """Random puts and pops with repeats inside a call, a moving floor (a ring's overwritten rows),
    and keys sharing 8 home buckets (long walks, marked buckets) or spread as hashes are."""
    rng = np.random.default_rng(low_bits)
    universe = rng.integers(0, 2**64, ids, dtype=np.uint64)
    universe = np.unique(universe & np.uint64(2**low_bits - 1) | (universe >> np.uint64(32) << np.uint64(32)))
    table, model, next_position, capacity = KeyTable(buckets=2), {}, 0, 700
    for _ in range(400):
        keys = rng.choice(universe, int(rng.integers(0, 120)))
        if rng.random() < 0.55:
            positions = np.arange(next_position, next_position + len(keys))
            next_position += len(keys)
            table.floor = max(0, next_position - capacity)
            table.put(keys, positions)
            model.update(zip(keys.tolist(), positions.tolist(), strict=True))  # the last occurrence's
        else:
            want = []
            for key in keys.tolist():
                found = model.pop(key, ABSENT)
                want.append(found if found >= table.floor else ABSENT)
            assert table.pop(keys).tolist() == want  # a repeat inside the call: found at its first
        model = {k: p for k, p in model.items() if p >= table.floor}
        keys, positions = table.live()
        assert dict(zip(keys.tolist(), positions.tolist(), strict=True)) == model
        assert len(table) == len(model)


def test_it_grows_and_clears_its_marks():
    rng = np.random.default_rng(0)
    clustered = np.unique(rng.integers(1, 2**50, 2_000, dtype=np.uint64)) << np.uint64(4)  # 1 bucket in 16 a home
    table = KeyTable(buckets=2)
    table.put(clustered, np.arange(len(clustered)))
    assert table.slots >= 2 * len(clustered) and table.cells.ctypes.data % 64 == 0  # a bucket: one cache line
    assert np.count_nonzero(table.overflow) * 16 > table.mask + 1  # the walks marked the buckets they passed
    assert table.pop(clustered[::-1]).tolist() == list(range(len(clustered)))[::-1]
    table.floor = len(clustered)
    spread = rng.integers(0, 2**64, 50_000, dtype=np.uint64)
    table.put(spread, np.arange(len(clustered), len(clustered) + 50_000))
    assert np.count_nonzero(table.overflow) * 100 < table.mask + 1  # rebuilt: the old marks gone
    assert len(table) == 50_000 and table.slots >= 4 * 50_000
    assert (table.pop(spread) >= len(clustered)).all()
