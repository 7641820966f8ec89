"""``shuffle: rebalance``: two trainer ranks pull their own lanes from two real ``primus executor``
processes over a real Kafka whose load is all on the partitions forward mode would give rank 0:
both ranks get half of it, and every sample is trained exactly once across an executor kill -9,
a checkpoint + commit and a restart of both ranks from it. Plus the lanes' rules in-process."""

from __future__ import annotations

import json
import signal
import threading

import numpy as np
import pyarrow as pa
import pytest

from primus_lib.data.executor.lanes import Lanes, interleave
from primus_lib.data.flight_client import ExecutorStreamReader
from primus_lib.resources.discovery import LocalDiscovery
from tests.data.test_replay import _events
from tests.data.test_stream_executor import _committed, _once, _produce, _pull, _spec, executors  # noqa: F401

SMALL = ("--buffer-rows", "300", "--poll-rows", "100")


def test_interleave_mixes_partitions_and_keeps_each_ones_order():
    keys = ["a"] * 50 + ["b"] * 50
    order = interleave(keys, np.random.default_rng(1))
    assert sorted(order) == list(range(100))
    picked = [keys[i] for i in order]
    assert [i for i in order if keys[i] == "a"] == list(range(50))  # a's rows keep their order
    assert [i for i in order if keys[i] == "b"] == list(range(50, 100))
    assert sum(x != y for x, y in zip(picked, picked[1:], strict=False)) > 10  # not two blocks


def test_lanes_split_by_offset_and_commit_the_lowest_over_the_ranks():
    lanes = Lanes(100, lanes=2)
    batch = pa.record_batch([pa.array(range(6))], names=["x"])
    pieces = dict(lanes.split(batch, ["t/0"] * 3 + ["t/1"] * 3, np.array([4, 5, 6, 0, 1, 2])))
    assert sorted(pieces) == [0, 1]
    assert sorted(pieces[0][2].tolist()) == [0, 2, 4, 6] and sorted(pieces[1][2].tolist()) == [1, 5]
    for lane, piece in pieces.items():
        assert lanes.put(lane, piece, 1.0)
    got = lanes.pop(1, 10, 1.0)
    assert got is not None and sorted(got[2].tolist()) == [1, 5]
    with pytest.raises(ValueError, match="lane 2 of 2"):
        lanes.pop(2, 10, 0.1)
    assert lanes.committable(0, {"t/0": 7}) == {}  # rank 1 has not committed yet
    assert lanes.committable(1, {"t/0": 6, "t/1": 2}) == {"t/0": 6}
    # a rank re-attaching rewinds to what it wants, but never past what another lane still needs
    assert lanes.rewind_to(0, {"t/0": 7}, {"t/0": 0, "t/1": 0}) == {"t/0": 6, "t/1": 0}


def _produce_skewed(broker, topic, n: int, partitions: list[int]) -> list[str]:
    events = _events(n, seed=17)
    for i, p in enumerate(partitions):
        broker.produce(topic, [json.dumps(e).encode() for e in events[i :: len(partitions)]], partition=p)
    return [e["request_id"] for e in events]


def _pull_both(readers: list[ExecutorStreamReader], want: list[int], timeout: float = 90.0) -> list[list[str]]:
    """Both ranks pull at once (a synchronous step needs both: one full lane holds every runner)."""
    out: list[list[str]] = [[] for _ in readers]

    def pull(i: int) -> None:
        out[i] += _pull(readers[i], want[i], timeout)

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(len(readers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def test_rebalance_spreads_skewed_partitions_over_the_ranks_exactly_once(kafka_broker, tmp_path, executors):  # noqa: F811
    topic = kafka_broker.new_topic(partitions=4)
    produced = _produce_skewed(kafka_broker, topic, 2000, [0, 2])  # forward would give rank 0 all of it
    spec, job = _spec(tmp_path, kafka_broker, topic, shuffle="rebalance")
    procs = [executors(spec, 0, 2, *SMALL), executors(spec, 1, 2, *SMALL)]
    discovery = LocalDiscovery.for_stream(job, "realtime")

    def ranks() -> list[ExecutorStreamReader]:
        return [
            ExecutorStreamReader(discovery, buffer_rows=200, pull_rows=50, rank=r, size=2, shuffle="rebalance")
            for r in range(2)
        ]

    readers = ranks()
    trained = _pull_both(readers, [400, 400])
    checkpoint = [r.position() for r in readers]  # every rank's position, in one checkpoint
    at_checkpoint = [list(t) for t in trained]
    for reader, position in zip(readers, checkpoint, strict=True):
        reader.commit(position)
    # a partition is committed once every rank has a position in it (``Lanes.committable``): a rank
    # may not have been dealt a row of a partition yet, when the other has
    low = {k: min(checkpoint[0][k], checkpoint[1][k]) for k in checkpoint[0] if k in checkpoint[1]}
    assert _committed(kafka_broker, topic, f"g-{topic}", 4) == low  # both ranks' rows are below it
    for i, more in enumerate(_pull_both(readers, [200, 200])):
        trained[i] += more
    procs[1].send_signal(signal.SIGKILL)  # restarts from the committed offsets, behind both ranks
    procs[1].wait()
    procs[1] = executors(spec, 1, 2, *SMALL)
    for i, more in enumerate(_pull_both(readers, [200, 200])):
        trained[i] += more
    assert all(_once(t) for t in trained) and not set(trained[0]) & set(trained[1])
    for reader in readers:  # both ranks die before their next checkpoint
        reader.close()
    readers = ranks()
    for reader, position in zip(readers, checkpoint, strict=True):
        reader.seek(position)
    try:
        rest = _pull_both(readers, [1000 - len(at_checkpoint[0]), 1000 - len(at_checkpoint[1])])
        assert _pull(readers[0], 1, timeout=2.0) == [] and _pull(readers[1], 1, timeout=2.0) == []
    finally:
        for reader in readers:
            reader.close()
    per_rank = [at_checkpoint[i] + rest[i] for i in range(2)]
    assert [len(ids) for ids in per_rank] == [1000, 1000]  # even, though all the load is on two partitions
    total = per_rank[0] + per_rank[1]
    assert sorted(total) == sorted(produced) and _once(total)


def test_forward_gives_each_rank_its_own_partitions_whatever_the_executors_start_with(
    kafka_broker,
    tmp_path,
    executors,  # noqa: F811
):
    """3 executors, 2 ranks: executor 0 of 3 starts with partitions 0 and 3, but rank 0 (executors
    0 and 2) owns partitions 0 and 2 and rank 1 (executor 1) partitions 1 and 3: the readers deal
    them so, and drop rows of the other rank's partitions meanwhile."""
    topic = kafka_broker.new_topic(partitions=4)
    produced = _produce(kafka_broker, topic, 1200, 4, seed=19)
    spec, job = _spec(tmp_path, kafka_broker, topic, replicas=3)
    for index in range(3):
        executors(spec, index, 3, *SMALL)
    discovery = LocalDiscovery.for_stream(job, "realtime")
    readers = [ExecutorStreamReader(discovery, buffer_rows=200, pull_rows=50, rank=r, size=2) for r in range(2)]
    try:
        ids = _pull_both(readers, [600, 600])
        assert _pull(readers[0], 1, timeout=2.0) == [] and _pull(readers[1], 1, timeout=2.0) == []
        shares = {i: set(s["partitions"]) for r in readers for i, s in r.executor_stats().items()}
    finally:
        for reader in readers:
            reader.close()
    partition = {rid: i % 4 for i, rid in enumerate(produced)}
    assert {partition[i] for i in ids[0]} == {0, 2} and {partition[i] for i in ids[1]} == {1, 3}
    assert shares == {0: {f"{topic}/0"}, 2: {f"{topic}/2"}, 1: {f"{topic}/1", f"{topic}/3"}}
    assert sorted(ids[0] + ids[1]) == sorted(produced) and _once(ids[0] + ids[1])
