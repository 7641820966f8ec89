"""The trainer's starvation signal: waiting counts only while an upstream has data to give."""

from __future__ import annotations

import time

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


def _sample_count(path) -> float:
    line = next(x for x in path.read_text().splitlines() if x.startswith("primus_trainer_samples_total{"))
    return float(line.rsplit(" ", 1)[1])


def test_snapshots_are_written_off_the_training_thread_and_the_last_one_now(tmp_path):
    """A checkpoint's or report's snapshot is put by a background thread (a put into the job's
    directory, on an object store a PUT, stalled the training loop); the run's last is written
    before ``publish`` returns, with every sample counted, and the thread is gone."""
    m = InputMetrics("job", 0, CollectorRegistry(), tmp_path, queues_full=lambda: False, every=3600)
    m.add_samples(512)
    m.add_samples(100)
    m.publish()
    thread = m.writer._thread
    assert thread is not None and thread.name == "primus-metrics"
    path = tmp_path / "trainer-0.prom"
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _sample_count(path) == 612
    m.add_samples(8)
    m.publish(last=True)
    assert _sample_count(path) == 620  # written by publish itself
    assert m.writer._thread is None and not thread.is_alive()


def test_closing_the_metrics_of_a_failed_run_stops_the_writer(tmp_path):
    m = InputMetrics("job", 0, CollectorRegistry(), tmp_path, queues_full=lambda: False, every=3600)
    m.publish()
    thread = m.writer._thread
    m.close()
    assert thread is not None and not thread.is_alive()
