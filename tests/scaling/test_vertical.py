from __future__ import annotations

import pytest

from primus_lib.scaling.forecast import forecast_change
from primus_lib.scaling.vertical import VerticalPolicy
from primus_lib.spec.scaling import VerticalScaling
from tests.scaling.helpers import GIB, context, history, snapshot

POLICY = VerticalPolicy(VerticalScaling())  # lookback 10m, margin 0.15, min_change 0.25


def test_paper_case_ten_cores_down_to_six():
    usage = [5.0, 5.1, 5.2, 5.1, 5.2, 5.2]
    d = POLICY.decide(context(snapshot(), cpu=10.0, memory=8 * GIB, history=history(usage, [6 * GIB] * 6)))
    expected = 5.2 + forecast_change(usage) + 0.15 * 5.2
    assert d.action == "resize" and d.cpu == pytest.approx(round(expected + 0.05, 1), abs=0.1)
    assert 5.9 <= d.cpu <= 6.1
    assert "peak 5.20" in d.reason and d.inputs["cpu_peak"] == 5.2


def test_rising_usage_grows_by_forecast():
    usage = [2.0, 2.5, 3.0, 3.5, 4.0]
    d = POLICY.decide(context(snapshot(), cpu=3.0, memory=8 * GIB, history=history(usage)))
    assert d.cpu > 4.0 * 1.15  # peak + positive forecast + margin


def test_small_changes_are_skipped():
    usage = [3.3, 3.4, 3.35]
    assert POLICY.decide(context(snapshot(), cpu=4.0, memory=4.6 * GIB, history=history(usage, [4 * GIB] * 3))) is None


def test_old_samples_are_outside_the_lookback():
    points = history([9.0, 9.0, 1.0, 1.0, 1.0, 1.0], step=180.0)  # the 9s are > 10 minutes old
    d = POLICY.decide(context(snapshot(), cpu=10.0, memory=8 * GIB, history=points))
    assert d.cpu < 2.0


def test_too_few_samples_hold():
    assert POLICY.decide(context(snapshot(), history=history([1.0, 1.0]))) is None


def test_oom_kill_grows_memory_at_once():
    ctx = context(snapshot(ooms=1), memory=8 * GIB, history=history([3.9, 3.9, 3.9], [4 * GIB] * 3), ooms=1)
    assert POLICY.urgent(ctx)
    d = POLICY.decide(ctx)
    assert d.memory == pytest.approx(12 * GIB) and "OOM" in d.reason
    assert d.memory > 8 * GIB  # never shrinks memory right after an OOM kill
