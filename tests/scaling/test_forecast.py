from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from primus_lib.scaling.forecast import forecast_change


def test_formula_by_hand():
    # R = [10, 12, 13, 16]: N = 3 changes 2, 1, 3 with weights 1/3, 1/2, 1
    assert forecast_change([10, 12, 13, 16]) == pytest.approx((2 / 3 + 1 / 2 + 3 / 1) / 3)


def test_recent_changes_weigh_more():
    early = forecast_change([0, 5, 5, 5, 5])
    late = forecast_change([0, 0, 0, 0, 5])
    assert late > early > 0


def test_flat_or_short_series_forecasts_nothing():
    assert forecast_change([]) == 0.0
    assert forecast_change([3.0]) == 0.0
    assert forecast_change([4.0, 4.0, 4.0]) == 0.0


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=30), st.floats(-1e3, 1e3))
def test_shift_invariant_and_sign_follows_monotone_trends(series, shift):
    assert forecast_change([x + shift for x in series]) == pytest.approx(forecast_change(series), abs=1e-3)
    rising = sorted(series)
    assert forecast_change(rising) >= 0
    assert forecast_change(rising[::-1]) <= 0
