"""primus_lib.timegrid: UTC parsing and the window grid, by property and by example."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone

import pendulum
import pytest
from hypothesis import given
from hypothesis import strategies as st

from primus_lib import timegrid

SIZES = st.sampled_from(sorted(timegrid.WINDOW_SIZES.values()))
# aware instants in a sane range, with arbitrary offsets (whole minutes, as real zones have)
OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
INSTANTS = st.datetimes(datetime(1990, 1, 1), datetime(2100, 1, 1), timezones=OFFSETS)


@given(INSTANTS, INSTANTS, SIZES)
def test_floor_is_on_the_grid_and_the_window_contains_the_instant(instant, origin, size):
    start = timegrid.floor(instant, size, origin)
    assert timegrid.on_grid(start, size, origin)
    assert start <= instant < start + size


@given(INSTANTS, INSTANTS, SIZES)
def test_ceil_is_the_first_grid_point_at_or_after(instant, origin, size):
    start = timegrid.ceil(instant, size, origin)
    assert timegrid.on_grid(start, size, origin)
    assert instant <= start < instant + size
    assert (start == instant) == timegrid.on_grid(instant, size, origin)


@given(INSTANTS, st.integers(0, 50), SIZES, INSTANTS)
def test_window_starts_are_consecutive_grid_points_inside_the_range(first, count, size, origin):
    stop = first + count * size
    starts = list(timegrid.window_starts(first, stop, size, origin))
    assert all(first <= s < stop and timegrid.on_grid(s, size, origin) for s in starts)
    assert all(b - a == size for a, b in itertools.pairwise(starts))
    assert len(starts) == count  # any range of count * size holds exactly count starts


def test_window_starts_without_a_stop_never_end():
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    endless = timegrid.window_starts(t0, None, timedelta(hours=1), t0)
    assert len(list(itertools.islice(endless, 1000))) == 1000


@given(INSTANTS)
def test_as_utc_and_iso_round_trip(instant):
    utc = timegrid.as_utc(instant)
    assert utc == instant and utc.tzinfo is UTC and type(utc) is datetime
    assert timegrid.parse_utc(utc.isoformat()) == utc
    assert timegrid.parse_utc(timegrid.iso(utc)) == utc.replace(microsecond=0)


@given(st.integers(-(2**41), 2**41))
def test_epoch_ms_round_trips(ms):
    assert timegrid.epoch_ms(timegrid.from_epoch_ms(ms)) == ms


def test_parse_utc_accepts_z_offsets_and_naive_as_utc():
    expected = datetime(2026, 11, 1, 5, tzinfo=UTC)
    for text in ("2026-11-01T05:00:00Z", "2026-11-01T05:00Z", "2026-11-01T07:00:00+02:00", "2026-11-01T05:00:00"):
        assert timegrid.parse_utc(text, "--from") == expected


def test_errors_name_the_flag_and_show_an_example():
    with pytest.raises(ValueError, match=r"--from: expected an ISO instant like 2026-11-01T00:00:00Z, got 'yesterday'"):
        timegrid.parse_utc("yesterday", "--from")
    with pytest.raises(ValueError, match="start: expected a timezone-aware instant"):
        timegrid.parse_utc("2026-11-01T05:00:00", "start", assume_utc=False)
    with pytest.raises(ValueError, match=r"window: expected one of \['1d', '1h'\], found '2h'"):
        timegrid.window_size("2h")


def test_as_utc_returns_a_plain_datetime_for_pendulum():
    value = timegrid.as_utc(pendulum.datetime(2026, 11, 1, 7, tz="Europe/Berlin"))
    assert type(value) is datetime and value == datetime(2026, 11, 1, 6, tzinfo=UTC)
    assert value - timedelta(hours=1) == datetime(2026, 11, 1, 5, tzinfo=UTC)


def test_epoch_grid_is_utc_boundaries():
    assert timegrid.on_grid(datetime(2026, 11, 1, 5, tzinfo=UTC), timedelta(hours=1), timegrid.EPOCH)
    assert not timegrid.on_grid(datetime(2026, 11, 1, 5, tzinfo=UTC), timedelta(days=1), timegrid.EPOCH)
    midnight_utc = datetime(2026, 11, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    assert timegrid.on_grid(midnight_utc, timedelta(days=1), timegrid.EPOCH)
