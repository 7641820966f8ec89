"""dtgg.packing: a window's data tasks in the orchestrator's units of work."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from primus_lib.data.dtgg.packing import OPEN_COST_BYTES, TARGET_BYTES, pack, weight
from primus_lib.data.task import DataTask

MIB = 2**20


def _tasks(sizes: list[int]) -> list[DataTask]:
    return [
        DataTask(f"t{i}", "history", "impressions", "20261101T000000Z", f"file:///d/{i}", f"/d/{i}", "parquet", size)
        for i, size in enumerate(sizes)
    ]


@given(
    sizes=st.lists(st.integers(0, 512 * MIB), max_size=60),
    slots=st.integers(1, 12),
    limit=st.one_of(st.none(), st.integers(1, 20)),
)
def test_every_task_once_units_in_planned_order_and_balanced(sizes, slots, limit):
    tasks = _tasks(sizes)
    units = pack(tasks, slots, limit)
    order = [[int(t.id[1:]) for t in unit] for unit in units]
    assert sorted(i for unit in order for i in unit) == list(range(len(tasks)))  # each task once
    assert all(unit == sorted(unit) for unit in order) and [u[0] for u in order] == sorted(u[0] for u in order)
    if not tasks:
        assert units == []
        return
    wanted = max(slots, -(-sum(map(weight, tasks)) // TARGET_BYTES))
    assert len(units) == min(wanted, len(tasks), limit or len(tasks))
    assert all(units)  # no empty unit: an empty mapped task would still cost a process
    loads = [sum(map(weight, unit)) for unit in units]
    assert max(loads) - min(loads) <= max(map(weight, tasks))  # the heaviest task to the lightest unit


def test_a_window_of_small_files_is_one_unit_per_executor():
    tasks = _tasks([4 * MIB] * 16)  # with each file's open cost: 128 MiB
    assert [len(unit) for unit in pack(tasks, 1)] == [16]
    assert [len(unit) for unit in pack(tasks, 2)] == [8, 8]
    assert [len(unit) for unit in pack(_tasks([6 * MIB] * 16), 1)] == [8, 8]  # 160 MiB: two units
    assert [len(unit) for unit in pack(tasks, 32)] == [1] * 16  # never more units than tasks


def test_a_large_partition_makes_units_of_about_the_target():
    tasks = _tasks([64 * MIB] * 100)
    units = pack(tasks, 2)
    assert len(units) == -(-100 * (64 * MIB + OPEN_COST_BYTES) // TARGET_BYTES) == 54
    assert {len(unit) for unit in units} == {1, 2}


def test_thousands_of_files_stay_within_the_map_length():
    """Airflow fails a run whose mapped task expands past ``[core] max_map_length``."""
    units = pack(_tasks([MIB] * 5000), 2000, limit=1024)
    assert len(units) == 1024 and sum(map(len, units)) == 5000


def test_a_split_weighs_its_range_not_its_file():
    whole, part = _tasks([1024 * MIB] * 2)
    part = DataTask.from_dict({**part.to_dict(), "offset": 0, "length": 10 * MIB, "splits": 100})
    assert weight(whole) == 1024 * MIB + OPEN_COST_BYTES and weight(part) == 10 * MIB + OPEN_COST_BYTES


@pytest.mark.parametrize(("slots", "limit", "message"), [(0, None, "slots: expected at least 1"), (1, 0, "limit")])
def test_bad_counts_are_refused(slots, limit, message):
    with pytest.raises(ValueError, match=message):
        pack(_tasks([1]), slots, limit)
