"""Stream executors report their sample-buffer fill to the scaler (once per delivered batch)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from primus_lib.data.buffer import SampleBuffer
from primus_lib.data.executor.stream import StreamGroup
from primus_lib.metrics import names as n
from primus_lib.metrics.instruments import ExecutorMetrics
from tests.data.test_buffer import _Partition


@pytest.mark.parametrize("mode", ["forward", "rebalance"])
def test_stream_group_sets_each_executors_buffer_fill(mode):
    registry = CollectorRegistry()
    metrics = [ExecutorMetrics("job", str(i), 1, 2**30, role="stream_executor", registry=registry) for i in range(2)]
    buffers = [SampleBuffer(400), SampleBuffer(400)]
    readers = {"p0": _Partition("p0", 200), "p1": _Partition("p1", 100)}
    group = StreamGroup(readers, buffers, mode=mode, poll_rows=50, metrics=metrics).start()
    deadline = time.monotonic() + 60
    while not group.finished() or sum(group.delivered) < 300:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    group.stop()
    fills = [
        registry.get_sample_value(n.BUFFER_UTILISATION, {"primus_job": "job", "role": "stream_executor", "worker": w})
        for w in ("0", "1")
    ]
    assert fills == [pytest.approx(len(b) / 400) for b in buffers]
    assert sum(fills) == pytest.approx(300 / 400)


def test_stream_group_wants_one_metrics_object_per_buffer():
    with pytest.raises(ValueError, match="one ExecutorMetrics per buffer"):
        StreamGroup({}, [SampleBuffer(10)], metrics=[])
