"""The trainer's starvation signal: waiting counts only while an upstream has data to give."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from primus_lib.train.runtime.input_metrics import InputMetrics


def _metrics(tmp_path) -> InputMetrics:
    metrics = InputMetrics("job", 0, CollectorRegistry(), tmp_path, queues_full=lambda: False, every=3600)
    metrics.writer.due = lambda: False  # keep the interval's sums (publishing resets them)
    return metrics


def test_waiting_behind_a_stream_with_lag_is_starvation(tmp_path):
    m = _metrics(tmp_path)
    m.end(began=0.0, fed=0.0, trained=False, full=False, live=False)  # an iteration without a step
    assert m.total > 0 and m.wait == m.total


def test_waiting_at_the_live_edge_is_idle_not_starvation(tmp_path):
    """A caught-up trainer (every stream source at its live edge) waits for events nobody has yet:
    more executors would not help, so the scaler must not read it as starvation."""
    m = _metrics(tmp_path)
    m.end(began=0.0, fed=0.0, trained=False, full=False, live=True)
    assert m.total == 0 and m.wait == 0
    began = m.begin()
    m.end(began=began, fed=began, trained=True, full=False, live=True)  # a step still counts
    assert m.total > 0 and m.wait <= m.total
