from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from primus_lib.data.buffer import SampleBuffer
from primus_lib.data.executor.stream import StreamGroup
from primus_lib.data.stream import StreamReader


def _batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"x": np.arange(start, start + n, dtype=np.int64)})


def test_buffer_pops_rows_across_batches_and_tracks_consumed_offsets():
    buf = SampleBuffer(100)
    buf.put(_batch(0, 30), (["t/0"] * 30, np.arange(10, 40)))
    buf.put(_batch(30, 30), (["t/1"] * 30, np.arange(0, 30)))
    assert len(buf) == 60 and buf.utilisation == pytest.approx(0.6)
    out = buf.pop(45)
    assert out.column("x").to_pylist() == list(range(45))
    assert buf.consumed_position() == {"t/0": 40, "t/1": 15}  # just past the last popped row
    assert buf.pop(100, timeout=0.05).num_rows == 15
    assert buf.pop(1, timeout=0.01) is None
    buf.put(_batch(60, 5))
    with pytest.raises(ValueError, match="positive"):
        buf.pop(0)
    assert len(buf) == 5


def test_buffer_is_bounded_and_blocks_producers():
    buf = SampleBuffer(50)
    assert buf.put(_batch(0, 40))
    assert not buf.put(_batch(40, 20), timeout=0.05)  # full: backpressure
    got = []
    thread = threading.Thread(target=lambda: got.append(buf.put(_batch(40, 20), timeout=5)))
    thread.start()
    assert buf.pop(40).num_rows == 40
    thread.join()
    assert got == [True] and len(buf) == 20


class _Partition(StreamReader):
    """A bounded in-memory partition; ``delay`` makes it slow (a lagging broker or skewed host)."""

    def __init__(self, name: str, rows: int, delay: float = 0.0, batch: int = 50, base: int = 0):
        self.name, self.rows, self.delay, self.batch, self.next, self.base = name, rows, delay, batch, 0, base
        self.polls = 0

    def poll(self, max_rows, timeout):
        if self.next >= self.rows:
            return None
        if self.delay:
            time.sleep(self.delay)
        n = min(self.batch, max_rows, self.rows - self.next)
        out = _batch(self.base + self.next, n)
        self.last_offsets = ([self.name] * n, np.arange(self.next, self.next + n))
        self.next += n
        self.polls += 1
        return out

    def position(self):
        return {self.name: self.next}

    def seek(self, position):
        self.next = position.get(self.name, 0)

    def end_of_data(self):
        return self.next >= self.rows


def _train(mode: str) -> tuple[int, StreamGroup]:
    """Two executors, each feeding one trainer; partition p0 is slow. Synchronous data-parallel
    steps need a minibatch from BOTH trainers; count steps until the slow partition has
    delivered 10 batches (the slow partition's progress is the clock, not the wall)."""
    slow = _Partition("p0", 10_000, delay=0.02)
    readers = {"p0": slow, "p1": _Partition("p1", 1_000_000)}
    buffers = [SampleBuffer(400), SampleBuffer(400)]
    group = StreamGroup(readers, buffers, mode=mode, poll_rows=50).start()
    steps = 0
    try:
        while slow.polls < 10:
            a = buffers[0].pop(50, timeout=0.05, partial=False)
            if a is None:
                continue
            while buffers[1].pop(50, timeout=0.05, partial=False) is None:
                pass
            steps += 1
    finally:
        group.stop()
        for b in buffers:
            b.close()
    assert not group.errors()
    return steps, group


def test_rebalance_keeps_throughput_with_one_slow_partition():
    forward, fgroup = _train("forward")
    rebalance, rgroup = _train("rebalance")
    # forward: trainer 0 only gets the slow partition -> about one step per slow batch
    assert forward <= 11
    # rebalance: the fast partition's data reaches both trainers
    assert rebalance >= 3 * forward
    assert rgroup.delivered[0] > rgroup.stats["p0"].rows  # executor 0 got data it did not fetch


def test_flight_serves_the_buffer_to_a_remote_reader():
    import pyarrow.flight as flight

    from primus_lib.data.flight import BufferFlightServer, FlightBufferClient

    buf = SampleBuffer(1000)
    buf.put(_batch(0, 120))
    server = BufferFlightServer(buf, pa.schema([("x", pa.int64())]), wait=0.05)
    client = FlightBufferClient(f"grpc://127.0.0.1:{server.port}")
    try:
        assert client.pop(100).column("x").to_pylist() == list(range(100))
        assert client.stats()["rows"] == 20
        assert client.pop(100).num_rows == 20
        assert client.pop(10) is None
        with pytest.raises(pa.ArrowException, match="integer"):
            client.client.do_get(flight.Ticket(b"rows=ten")).read_all()
        assert len(buf) == 0
    finally:
        client.close()
        server.shutdown()


def test_rebalance_safe_position_never_skips_a_row_waiting_elsewhere():
    """With two buffers a partition's rows are spread over both; the committable position must
    stay below every row not yet popped (in a buffer, in the exchange, or in flight)."""
    readers = {f"p{i}": _Partition(f"p{i}", 3000, batch=37, base=i * 1_000_000) for i in range(3)}
    buffers = [SampleBuffer(300), SampleBuffer(300)]
    group = StreamGroup(readers, buffers, mode="rebalance", poll_rows=37, exchange_batches=4).start()
    popped: dict[str, set[int]] = {name: set() for name in readers}
    committed = 0
    try:
        for step in range(80):
            batch = buffers[step % 3 % 2].pop(25, timeout=2.0, partial=False)
            assert batch is not None
            for value in batch.column("x").to_pylist():
                popped[f"p{value // 1_000_000}"].add(value % 1_000_000)
            for key, offset in group.safe_position().items():
                assert set(range(offset)) <= popped[key], f"{key}: committing {offset} would skip unconsumed rows"
                committed += offset
    finally:
        group.stop()
    assert committed > 0


def test_pop_tagged_returns_the_partition_and_offset_of_every_row_and_clear_drops_the_rest():
    buf = SampleBuffer(1000)
    buf.put(_batch(0, 5), (["a"] * 5, np.arange(100, 105)))
    buf.put(_batch(5, 4), (["b", "b", "a", "a"], np.array([7, 8, 105, 106])))
    batch, keys, offsets = buf.pop_tagged(7)
    assert batch.column("x").to_pylist() == list(range(7))
    assert keys == ["a"] * 5 + ["b", "b"] and offsets.tolist() == [100, 101, 102, 103, 104, 7, 8]
    assert buf.consumed_position() == {"a": 105, "b": 9}
    assert buf.clear() == 2 and len(buf) == 0 and buf.pop(1, timeout=0.01) is None


def test_a_tagged_flight_server_hands_out_offsets_and_runs_actions():
    from primus_lib.data.flight import BufferFlightServer, FlightBufferClient

    buf = SampleBuffer(1000)
    buf.put(_batch(0, 6), (["t/0"] * 3 + ["t/1"] * 3, np.array([10, 11, 12, 0, 1, 2])))
    calls = []
    actions = {"commit": lambda body: calls.append(body) or {"committed": body["position"]}}
    server = BufferFlightServer(buf, pa.schema([("x", pa.int64())]), wait=0.05, tagged=True, actions=actions)
    client = FlightBufferClient(f"grpc://127.0.0.1:{server.port}")
    try:
        batch, keys, offsets = client.pop_tagged(4)
        assert batch.schema.names == ["x"] and batch.column("x").to_pylist() == [0, 1, 2, 3]
        assert keys == ["t/0", "t/0", "t/0", "t/1"] and offsets.tolist() == [10, 11, 12, 0]
        assert client.action("commit", {"position": {"t/0": 13}}) == {"committed": {"t/0": 13}}
        assert calls == [{"position": {"t/0": 13}}]
        with pytest.raises(pa.ArrowException, match="unknown action"):
            client.action("nope")
        assert client.pop_tagged(10)[2].tolist() == [1, 2] and client.pop_tagged(10) is None
    finally:
        client.close()
        server.shutdown()
