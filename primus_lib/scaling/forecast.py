"""The paper's usage forecast: D(N) = sum_i w(i) (R_i - R_{i-1}) / N with w(i) = 1 / (N - i + 1).

The most recent change (i = N) weighs 1, the one before 1/2, then 1/3, ...: recent trends count more.
"""

from __future__ import annotations

from collections.abc import Sequence


def forecast_change(samples: Sequence[float]) -> float:
    """The forecast next change from samples R_0..R_N (oldest first); 0 with fewer than two."""
    n = len(samples) - 1
    if n < 1:
        return 0.0
    total = 0.0
    for i in range(1, n + 1):
        total += (samples[i] - samples[i - 1]) / (n - i + 1)
    return total / n
