"""Data-parallel training with two gloo ranks on the CPU: replicas stay bit-identical, Algorithm 1's
separation holds on every rank, two ranks equal one process on the union of their rows, and a
killed two-rank `primus train` under torchrun resumes with every sample used exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.json as pajson
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from primus_lib.cli.main import main
from primus_lib.data.sources.kafka import default_group
from primus_lib.evaluation.replay import TableStreamReader, batch_window, stream_file
from primus_lib.paths import JobPaths
from primus_lib.spec import load_job
from primus_lib.train.checkpoint.store import load_latest
from primus_lib.train.distributed.group import Group
from primus_lib.train.model.batch import to_batch
from primus_lib.train.model.stepper import LocalStepper
from primus_lib.train.runtime.sample_log import first_run_pids, read_sample_log, read_sample_logs
from primus_lib.train.runtime.trainer import Trainer, TrainerOptions
from tests.fixtures.specs import job_doc, kafka_stream, write_spec
from tests.train.conftest import START, commit_windows, write_job

KINDS = ["batch", "stream", "batch", "stream", "stream", "batch"]
ROWS = 64


def _minibatches(job):
    """Global minibatches of 64 replay rows (the same on every rank)."""
    stream = job.stream("realtime")
    table = stream_file(job, stream, Path(stream.sources[0].uri.removeprefix("file://")))
    return [table.slice(k * ROWS, ROWS) for k in range(len(KINDS))]


def _params(module_params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module_params]


class LiveReplay(TableStreamReader):
    """A replay that never ends, like a Kafka topic."""

    def end_of_data(self) -> bool:
        return False


def _gate_run(job, rank: int) -> dict:
    """The batch-lag rule over ranks: only rank 0 owns a stream partition (live, inside hour 2, the
    clock at 02:59:59); rank 1 must still not read window 01:00, which needs the stream at 03:00."""
    stream = job.stream("realtime")
    table = stream_file(job, stream, Path(stream.sources[0].uri.removeprefix("file://")))
    table = table.filter(pc.less(table.column("ts"), int((START + timedelta(hours=3)).timestamp() * 1000)))
    readers = {"realtime": [LiveReplay(table)] if rank == 0 else []}
    now = (START + timedelta(hours=2, minutes=59, seconds=59)).timestamp()
    options = TrainerOptions(poll_interval=0.01, idle_exit=0.5)
    trainer = Trainer(job, options, readers, CollectorRegistry(), clock=lambda: now)
    trainer.run()
    feed = trainer.batch_feeds["history"]
    history = trainer.reader.buffers["history"].rows + trainer.reader.served["history"]
    consumed = json.loads(JobPaths.for_job(job).progress.read_text())["consumed"] if rank == 0 else {}
    return {
        "seq": feed.seq,
        "done_seq": feed.done_seq,
        "served": trainer.reader.served,
        "history": history,
        "consumed": {k: v["samples"] for k, v in consumed.items() if k.startswith("history/")},
    }


def _worker(rank: int, store: str, spec: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        job = load_job(spec)
        stepper = LocalStepper(job, tables="replicated")
        group = Group()
        group.broadcast_params(stepper.model)
        model = stepper.model
        for kind, table in zip(KINDS, _minibatches(job), strict=True):
            mine = table.take(list(range(rank, table.num_rows, 2)))  # this rank's half of the global minibatch
            memory, adapt = _params(model.memory_parameters()), _params(model.adapt_parameters())
            stepper.step(kind, to_batch(mine, job.spec.features), table.num_rows, group)
            adapt_moved = any(not torch.equal(a, b) for a, b in zip(adapt, model.adapt_parameters(), strict=True))
            memory_moved = any(not torch.equal(a, b) for a, b in zip(memory, model.memory_parameters(), strict=True))
            assert memory_moved and adapt_moved == (kind == "stream"), (kind, memory_moved, adapt_moved)
        torch.save(stepper.state_dict(), Path(out) / f"rank{rank}.pt")
        (Path(out) / f"gate{rank}.json").write_text(json.dumps(_gate_run(job, rank)))
    finally:
        dist.destroy_process_group()


def test_two_ranks_stay_identical_and_match_one_process(tiny, tmp_path):
    spec, job = tiny
    sizes = commit_windows(job, range(6))
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(spec), str(tmp_path)), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=False)
    assert r0["model"].keys() == r1["model"].keys()
    for name, tensor in r0["model"].items():  # replicas: bit-identical weights, towers and embeddings
        assert torch.equal(tensor, r1["model"][name]), name
    assert torch.equal(r0["sparse_optimizer"]["state"][0]["sum"], r1["sparse_optimizer"]["state"][0]["sum"])

    # One process stepping the union of both halves gives the same model (up to summation order).
    torch.set_num_threads(1)
    single = LocalStepper(job, tables="replicated")
    for kind, table in zip(KINDS, _minibatches(job), strict=True):
        single.step(kind, to_batch(table, job.spec.features), table.num_rows, Group())
    for name, tensor in single.model.state_dict().items():
        assert torch.allclose(tensor, r0["model"][name], atol=1e-5), name
    initial = LocalStepper(job, tables="replicated").model.state_dict()
    assert any(not torch.equal(initial[n], r0["model"][n]) for n in initial if "embedding" in n)  # tables trained

    gates = [json.loads((tmp_path / f"gate{r}.json").read_text()) for r in range(2)]
    assert [(g["seq"], g["done_seq"]) for g in gates] == [(1, 1), (1, 1)], gates  # window 00 read, 01 not
    assert gates[0]["served"]["realtime"] > 0 and gates[1]["served"]["realtime"] == 0
    assert gates[0]["history"] + gates[1]["history"] == sizes[0]  # window 00, shared out by shard
    # 01 may not be read and every rank read all of 00: its remainders went as one partial step
    assert sizes[0] % 128 and gates[0]["served"]["history"] + gates[1]["served"]["history"] == sizes[0]
    assert gates[0]["consumed"] == {"history/20261101T000000Z": sizes[0]}
    assert any(not torch.equal(initial[n], r0["model"][n]) for n in initial if "embedding" in n)  # tables trained


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 30
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)


@pytest.mark.parametrize("sharding", ["replicate", "dmp"])
def test_two_rank_torchrun_killed_and_resumed_uses_every_sample_once(tiny, tmp_path, sharding):
    """Replicated tables, and tables sharded by TorchRec DistributedModelParallel (table-wise on gloo)."""
    spec, job = tiny
    write_spec(spec, job_doc(batch_size=16, sharding=sharding, collective_timeout="120s"))
    sizes = commit_windows(job, range(6))
    log = tmp_path / "ids.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [
        *torchrun,
        "-m",
        "primus_lib.cli.main",
        "train",
        str(spec),
        "--checkpoint-steps",
        "4",
        "--poll-interval",
        "0.05",
        "--idle-exit",
        "5",
        "--sample-log",
        str(log),
    ]
    rank_logs = [Path(f"{log}.rank{r}") for r in range(2)]
    proc = subprocess.Popen([*cmd, "--step-delay", "0.05"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            steps = min(p.read_text().count("\nstep ") if p.exists() else 0 for p in rank_logs)
            if steps >= 15 and proc.poll() is None:
                break
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            time.sleep(0.01)
        for pid in [*first_run_pids(rank_logs), proc.pid]:  # the launcher and both ranks at once
            os.kill(pid, signal.SIGKILL)
        proc.wait(30)
        _wait_gone(first_run_pids(rank_logs))
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in first_run_pids(rank_logs):  # torchrun starts each rank in its own session
            _kill_quietly(pid)
    assert proc.returncode == -signal.SIGKILL

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "rank 0/2" in done.stdout and "rank 1/2" in done.stdout, done.stdout[-2000:]

    per_rank = [read_sample_log(path.read_text()).resumed_at for path in rank_logs]
    for resumed_at in per_rank:
        assert len(resumed_at) == 2 and resumed_at[0] == 0 and resumed_at[1] > 0, resumed_at
    assert per_rank[0] == per_rank[1]  # both ranks resumed from the same checkpoint
    final = int(done.stdout.split("rank 0/2: step ")[1].split(",")[0])
    assert per_rank[0][1] < final, (per_rank, final)  # killed mid-run, not after the end
    events = pajson.read_json(str(tmp_path / "data" / "stream" / "events.jsonl")).column("request_id").to_pylist()
    batch_ids = []
    for hour in range(6):
        batch_ids += (
            batch_window(job, job.stream("history"), START + timedelta(hours=hour)).column("request_id").to_pylist()
        )
    expected = Counter([("realtime", i) for i in events] + [("history", i) for i in batch_ids])
    trained = read_sample_logs([path.read_text() for path in rank_logs])
    counts = trained.count(expected)
    print(f"\n{sharding}: resumed from step {per_rank[0][1]}: {counts}")
    assert counts.exactly_once, counts  # exactly once in the checkpointed model state, over both ranks
    assert set(trained.raw) == set(expected)  # the raw step log: at least once

    progress = json.loads(JobPaths.for_job(job).progress.read_text())  # rank 0's, summed over ranks
    windows = {k: v for k, v in progress["consumed"].items() if k.startswith("history/")}
    assert [v["samples"] for _, v in sorted(windows.items())] == sizes
    stream = {k: v["samples"] for k, v in progress["consumed"].items() if k.startswith("realtime/")}
    assert sum(stream.values()) == len(events)
    assert all(0.0 <= v["auc"] <= 1.0 and v["logloss"] > 0 for v in windows.values())
    assert len(progress["stream_position"]["realtime"]) == 2  # one replay share per rank
    sharded = Path(JobPaths.for_job(job).checkpoints) / "sharded"  # a local job
    if sharding == "dmp":  # the model state went through torch.distributed.checkpoint, one file per rank
        assert sorted(p.name for p in next(sharded.iterdir()).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    else:
        assert not sharded.exists()

    # A two-rank checkpoint is not resumed by a different world size (each rank's cursors follow its share).
    single = subprocess.run(
        [sys.executable, *cmd[len(torchrun) :]], env=env, capture_output=True, text=True, timeout=120
    )
    assert single.returncode != 0 and "checkpoint written by 2 rank(s), this trainer runs 1" in single.stderr


@pytest.mark.integration
def test_two_ranks_split_kafka_partitions_and_commit_after_checkpoint(kafka_broker, tmp_path, monkeypatch, capsys):
    """Two ranks read disjoint partitions of a real Apache Kafka topic; each rank's group offsets
    are the checkpointed ones; no event is trained twice."""
    topic = kafka_broker.new_topic(partitions=2, prefix="ctr")
    doc = job_doc(hours=2, lag="1h", stream=kafka_stream(kafka_broker.bootstrap, topic), mode="online", batch_size=16)
    spec = write_job(tmp_path, monkeypatch, doc, "kafka.yaml")
    assert main(["datagen", str(spec), "--rows-per-hour", "100", "--seed", "2", "--kafka", kafka_broker.bootstrap]) == 0
    capsys.readouterr()
    events = [json.loads(line)["request_id"] for line in (tmp_path / "data" / "stream" / "events.jsonl").open()]
    log = tmp_path / "ids.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "primus_lib.cli.main", "train", str(spec), "--poll-interval", "0.05", "--idle-exit", "3"]
    cmd += ["--sample-log", str(log)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    job = load_job(spec)
    progress = json.loads(JobPaths.for_job(job).progress.read_text())
    ranks = load_latest(JobPaths.for_job(job).checkpoints).position["ranks"]
    checkpointed: dict[str, int] = {}
    for rank, position in enumerate(ranks):
        for feed in position["stream"]["realtime"]:
            for key, offset in feed["offsets"].items():
                assert int(key.rpartition("/")[2]) % 2 == rank, (rank, key)  # partition p -> rank p % 2
                checkpointed[key] = offset
    assert progress["stream_position"]["realtime"]  # rank 0 wrote the positions of every rank
    assert sum(checkpointed.values()) == len(events)  # everything read; the untrained remainder is in the checkpoint
    consumer = Consumer(kafka_broker.config({"group.id": default_group(job, job.stream("realtime"))}))
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(2)], timeout=10)
    finally:
        consumer.close()
    for tp in committed:
        assert checkpointed.get(f"{topic}/{tp.partition}", -1001) == tp.offset
    trained = read_sample_logs([Path(f"{log}.rank{r}").read_text() for r in range(2)]).kept
    assert max(trained.values()) == 1 and {i for _, i in trained} <= set(events)
    assert sum(trained.values()) >= len(events) - 2 * 16  # at most a partial minibatch per rank waits
