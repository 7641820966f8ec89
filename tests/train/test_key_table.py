"""The row-key table (key_table.py) against a dict, one minibatch at a time."""

from __future__ import annotations

import numpy as np
import pytest

from primus_lib.train.model.key_table import ABSENT, KeyTable


@pytest.mark.parametrize(("ids", "low_bits"), [(200, 3), (3_000, 64)])
def test_the_table_does_what_a_dict_does(ids, low_bits):
    """Random puts and pops with repeats inside a call, a moving floor (a ring's overwritten rows),
    keys sharing their low bits or spread as hashes are; the hash table rebuilt many times."""
    rng = np.random.default_rng(low_bits)
    universe = rng.integers(0, 2**64, ids, dtype=np.uint64)
    universe = np.unique(universe & np.uint64(2**low_bits - 1) | (universe >> np.uint64(32) << np.uint64(32)))
    capacity = 700
    table, model, next_position = KeyTable(capacity), {}, 0
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


def test_it_forgets_dead_and_popped_keys_as_it_goes():
    """A long stream through a small ring: the hash table's entries stay bounded by its rebuilds."""
    rng = np.random.default_rng(0)
    capacity, step = 5_000, 512
    table = KeyTable(capacity)
    for start in range(0, 400_000, step):
        keys = rng.integers(0, 2**64, step, dtype=np.uint64)
        table.floor = max(0, start + step - capacity)
        table.put(keys, np.arange(start, start + step))
        if start % 3 == 0:
            assert (table.pop(keys[: step // 2]) >= table.floor).all()
    assert table.entries <= 2 * capacity
    keys, positions = table.live()
    assert len(table) == len(keys) <= capacity and (positions >= table.floor).all()
    assert (table.pop(keys) == positions).all() and len(table) == 0
