from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from airflow.timetables.base import DataInterval, TimeRestriction
from primus_operators.timetables import PrimusWindowTimetable

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def starts(table: PrimusWindowTimetable, earliest=T0, latest=None, catchup=True) -> list[datetime]:
    out, last = [], None
    while True:
        info = table.next_dagrun_info(
            last_automated_data_interval=last, restriction=TimeRestriction(earliest, latest, catchup)
        )
        if info is None:
            return out
        assert info.data_interval.end - info.data_interval.start == table.size
        out.append(info.data_interval.start)
        last = info.data_interval


def test_hourly_windows_from_start_to_end_with_lag_in_run_after():
    table = PrimusWindowTimetable(T0, "1h", T0 + timedelta(hours=4), lag=timedelta(hours=24))
    assert starts(table) == [T0 + timedelta(hours=h) for h in range(4)]
    first = table.next_dagrun_info(last_automated_data_interval=None, restriction=TimeRestriction(T0, None, True))
    assert first.run_after == T0 + timedelta(hours=25)  # window end + lag: the data is complete then


def test_daily_windows_and_backfill_range_is_inclusive_of_window_starts():
    table = PrimusWindowTimetable(T0, "1d")
    got = starts(table, earliest=T0 + timedelta(hours=5), latest=T0 + timedelta(days=3))
    assert got == [T0 + timedelta(days=d) for d in (1, 2, 3)]


def test_no_catchup_starts_at_newest_complete_window_and_finished_timer_yields_nothing():
    table = PrimusWindowTimetable(T0, "1h", T0 + timedelta(hours=4))
    assert starts(table, catchup=False) == []  # the timer ended long before "now"
    open_ended = PrimusWindowTimetable(T0, "1h")
    info = open_ended.next_dagrun_info(last_automated_data_interval=None, restriction=TimeRestriction(T0, None, False))
    assert info.data_interval.end <= datetime.now(UTC)
    assert datetime.now(UTC) - info.data_interval.end < timedelta(hours=2)


def test_manual_run_gets_the_window_containing_it_and_serialization_round_trips():
    table = PrimusWindowTimetable(T0 + timedelta(minutes=30), "1h", lag=timedelta(minutes=5))
    interval = table.infer_manual_data_interval(run_after=T0 + timedelta(hours=3, minutes=10))
    assert interval == DataInterval(T0 + timedelta(hours=2, minutes=30), T0 + timedelta(hours=3, minutes=30))
    again = PrimusWindowTimetable.deserialize(table.serialize())
    assert again == table and again.lag == timedelta(minutes=5) and again.summary == table.summary


def test_after_an_unaligned_last_interval_the_next_window_is_aligned():
    table = PrimusWindowTimetable(T0, "1h")
    last = DataInterval(T0, T0 + timedelta(minutes=90))
    info = table.next_dagrun_info(last_automated_data_interval=last, restriction=TimeRestriction(T0, None, True))
    assert info.data_interval.start == T0 + timedelta(hours=2)


def test_bad_window_and_naive_instants_are_rejected():
    with pytest.raises(ValueError, match="window"):
        PrimusWindowTimetable(T0, "2h")
    with pytest.raises(ValueError, match="timezone-aware"):
        PrimusWindowTimetable(datetime(2026, 11, 1), "1h")


def test_registered_in_the_plugin_and_serialized_with_a_dag():
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization
    from primus_operators.plugin import PrimusPlugin

    assert PrimusWindowTimetable in PrimusPlugin.timetables
    table = PrimusWindowTimetable(T0, "1h", T0 + timedelta(hours=2))
    dag = DAG("tt", schedule=table, start_date=T0)
    restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert restored.timetable.serialize() == table.serialize()


def test_run_ids_name_the_window_not_run_after():
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.types import DagRunType

    table = PrimusWindowTimetable(T0, "1h", lag=timedelta(hours=24))
    info = table.next_dagrun_info(
        last_automated_data_interval=DataInterval(T0 + timedelta(hours=1), T0 + timedelta(hours=2)),
        restriction=TimeRestriction(T0, None, True),
    )
    assert info.run_after == T0 + timedelta(days=1, hours=3)  # what Airflow labels the run with
    # The scheduler asks the deserialized DAG's timetable, as here.
    restored = DagSerialization.from_dict(DagSerialization.to_dict(_dag(table))).timetable
    scheduled = restored.generate_run_id(
        run_type=DagRunType.SCHEDULED, run_after=info.run_after, data_interval=info.data_interval, partition_key=None
    )
    assert scheduled == "scheduled__window_2026-11-01T02:00Z"
    manual = restored.generate_run_id(
        run_type=DagRunType.MANUAL,
        run_after=datetime(2026, 11, 30, 14, 5, 9, 123, tzinfo=UTC),
        data_interval=restored.infer_manual_data_interval(run_after=T0 + timedelta(hours=2, minutes=30)),
    )
    assert manual == "manual__window_2026-11-01T02:00Z_at_2026-11-30T14:05:09Z"  # a window can be re-run by hand
    no_window = restored.generate_run_id(
        run_type=DagRunType.MANUAL, run_after=datetime(2026, 11, 30, tzinfo=UTC), data_interval=None
    )
    assert no_window == "manual__2026-11-30T00:00:00+00:00"  # Airflow's own: no logical date, no window


def _dag(table: PrimusWindowTimetable):
    from airflow.sdk import DAG

    return DAG("tt_ids", schedule=table, start_date=T0)
