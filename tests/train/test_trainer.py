"""The trainer loop in-process: the batch-lag rule, mode routing, offsets committed after
checkpoints, progress.json."""

from __future__ import annotations

import gc
import itertools
import json
import os
import threading
import weakref
from datetime import timedelta

import pyarrow.compute as pc
import pytest
from prometheus_client import CollectorRegistry

from primus_lib.evaluation.replay import TableStreamReader, stream_file
from primus_lib.paths import JobPaths
from primus_lib.train.checkpoint.store import load_latest
from primus_lib.train.runtime.prefetch import Prefetcher
from primus_lib.train.runtime.trainer import Trainer, TrainerOptions
from tests.train.conftest import START, commit_windows


class LiveReader(TableStreamReader):
    """A replay that never ends (like Kafka) and records what was committed, and when."""

    def __init__(self, table, paths):
        super().__init__(table)
        self.paths = paths
        self.commits: list[tuple[dict, int | None]] = []
        self.threads: list[str] = []  # the thread of each commit
        self.nice: list[int] = []  # and its nice value

    def end_of_data(self) -> bool:
        return False

    def commit(self, position) -> None:
        ckpt = load_latest(self.paths.checkpoints)
        self.commits.append(
            (dict(position), None if ckpt is None else ckpt.position["stream"]["realtime"][0]["offsets"]["replay"])
        )
        self.threads.append(threading.current_thread().name)
        self.nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))


def _events(job, until_hour: int):
    events = job.stream("realtime").sources[0].uri.removeprefix("file://")
    table = stream_file(job, job.stream("realtime"), events)
    limit = int((START + timedelta(hours=until_hour)).timestamp() * 1000)
    return table.filter(pc.less(table.column("ts"), limit))


def test_batch_window_waits_for_stream_to_pass_window_plus_lag(tiny):
    _, job = tiny
    sizes = commit_windows(job, range(6))
    paths = JobPaths.for_job(job)
    reader = LiveReader(_events(job, 3), paths)  # the stream is inside hour 2 (02:xx) and stays there
    registry = CollectorRegistry()
    now = (START + timedelta(hours=2, minutes=59, seconds=59)).timestamp()  # the live stream's present
    options = TrainerOptions(poll_interval=0.01, idle_exit=0.3)
    trainer = Trainer(job, options, {"realtime": [reader]}, registry, clock=lambda: now)
    summary = trainer.run()
    consumed = json.loads(paths.progress.read_text())["consumed"]
    # lag 2h: window 00:00 needs the stream at 02:00 (it is), window 01:00 needs 03:00 (it is not).
    # Window 00:00 was read completely and the next one may not be read: its last partial
    # minibatch is trained on its own, so the window is consumed without waiting for 01:00.
    feed = trainer.batch_feeds["history"]
    assert feed.done_seq == 1 and feed.position()["seq"] == 1, summary
    assert sizes[0] % 64 and trainer.reader.buffers["history"].rows == 0
    assert trainer.reader.served["history"] == sizes[0]
    assert [k for k in consumed if k.startswith("history/")] == ["history/20261101T000000Z"]
    assert consumed["history/20261101T000000Z"]["samples"] == sizes[0]
    stream = sorted(k for k in consumed if k.startswith("realtime/"))
    assert stream[:2] == ["realtime/20261101T000000Z", "realtime/20261101T010000Z"]
    assert registry.get_sample_value("primus_trainer_rows_served_total", {"stream": "realtime"}) > 0
    # offsets reach the source only after a checkpoint covering them was committed
    assert reader.commits
    for committed, checkpointed in reader.commits:
        assert checkpointed is not None and committed["replay"] == checkpointed


def test_offline_reads_no_stream_and_online_no_batch(tiny, tmp_path, monkeypatch):
    _, job = tiny
    sizes = commit_windows(job, range(6))
    paths = JobPaths.for_job(job)
    reader = LiveReader(_events(job, 6), paths)
    summary = Trainer(job, TrainerOptions(mode="offline", poll_interval=0.01), {"realtime": [reader]}).run()
    progress = json.loads(paths.progress.read_text())
    assert progress["mode"] == "offline" and reader.offset == 0, summary
    assert [v["samples"] for k, v in sorted(progress["consumed"].items())] == sizes

    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home-online"))
    reader = LiveReader(_events(job, 6), JobPaths.for_job(job))
    trainer = Trainer(job, TrainerOptions(mode="online", poll_interval=0.01, idle_exit=0.3), {"realtime": [reader]})
    trainer.run()
    assert trainer.batch_feeds == {}
    served, waiting = trainer.reader.served["realtime"], trainer.reader.buffers["realtime"].rows
    assert served % 64 == 0 and waiting < 64 and served + waiting == reader.table.num_rows
    assert len(reader.commits) >= 5  # stream-only: a checkpoint each time the stream enters a new hour
    # the loop's checkpoints commit from the writer thread (a broker round trip stalls no step); the
    # last one, written as the trainer stops, from the training thread
    assert set(reader.threads[:-1]) == {"primus-checkpoint_0"} and reader.threads[-1] == "MainThread"
    # the writer yields the CPU to the training thread's helpers (nice 19); the training thread keeps its own
    assert set(reader.nice[:-1]) == {19} and reader.nice[-1] == os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.parametrize("prefetch", [True, False])
def test_until_window_and_progress_format(tiny, prefetch):
    _, job = tiny
    commit_windows(job, range(6))
    reader = TableStreamReader(_events(job, 6))
    options = TrainerOptions(until_window="20261101T010000Z", poll_interval=0.01, prefetch=prefetch)
    trainer = Trainer(job, options, {"realtime": [reader]})
    trainer.run()
    progress = json.loads(JobPaths.for_job(job).progress.read_text())
    assert set(progress) >= {"consumed", "step", "stream_position"}
    assert "history/20261101T010000Z" in progress["consumed"]
    assert "history/20261101T020000Z" not in progress["consumed"]
    for entry in progress["consumed"].values():
        assert set(entry) == {"samples", "auc", "logloss", "at"}
    assert progress["step"] == trainer.step > 0


def test_offline_then_online_trains_batch_first_then_stream_after_switch(tiny, tmp_path):
    _, job = tiny
    sizes = commit_windows(job, range(6))
    log = tmp_path / "ids.log"
    reader = TableStreamReader(_events(job, 6))
    switch = START + timedelta(hours=4)  # lag 2h: batch windows 00, 01; stream from 02:00 on
    options = TrainerOptions(mode="offline_then_online", switch_at=switch, poll_interval=0.01, sample_log=log)
    trainer = Trainer(job, options, {"realtime": [reader]})
    trainer.run()
    kinds = [line.split(" ")[2] for line in log.read_text().splitlines() if line.startswith("step ")]
    first_stream = kinds.index("realtime")
    assert set(kinds[:first_stream]) == {"history"} and set(kinds[first_stream:]) == {"realtime"}
    assert trainer.reader.served["history"] == sizes[0] + sizes[1]
    keep_from = int((START + timedelta(hours=2)).timestamp() * 1000)
    expected = pc.sum(pc.greater_equal(reader.table.column("ts"), keep_from)).as_py()
    assert trainer.reader.served["realtime"] == expected


def test_caught_up_stream_releases_batch_windows_by_the_clock(tiny):
    """A live stream with nothing newer (a finished demo topic): its present is the clock."""
    _, job = tiny
    sizes = commit_windows(job, range(6))
    reader = LiveReader(_events(job, 3), JobPaths.for_job(job))
    later = (START + timedelta(hours=8)).timestamp()  # every window + 2 h lag has passed
    options = TrainerOptions(until_window="20261101T050000Z", poll_interval=0.01)
    trainer = Trainer(job, options, {"realtime": [reader]}, clock=lambda: later)
    trainer.run()
    consumed = json.loads(JobPaths.for_job(job).progress.read_text())["consumed"]
    assert [consumed[f"history/20261101T0{h}0000Z"]["samples"] for h in range(6)] == sizes


def _steps(log) -> list[tuple[str, list[str]]]:
    lines = [line.split(" ") for line in log.read_text().splitlines() if line.startswith("step ")]
    return [(parts[2], parts[3].split(",")) for parts in lines]


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_lone_window_completes_without_the_next_one(tmp_path, monkeypatch, prefetch):
    """A service trainer with an open timer: window 00 (not a multiple of the minibatch) is consumed
    with a smaller last minibatch while 01 is not committed; 01, committed later, is consumed by a
    resumed trainer; every sample is trained exactly once."""
    from tests.train.conftest import make_job

    _, job = make_job(tmp_path, monkeypatch, mode="offline", hours=23)  # timer end far away
    log = tmp_path / "ids.log"
    paths = JobPaths.for_job(job)
    options = TrainerOptions(poll_interval=0.01, idle_exit=1.0, sample_log=log, prefetch=prefetch)
    first = commit_windows(job, range(1))
    assert first[0] % 64, first  # the window ends in a partial minibatch
    trainer = Trainer(job, options)
    trainer.run()  # no --until-window: it returns only after a second without new data
    consumed = json.loads(paths.progress.read_text())["consumed"]
    assert consumed == {"history/20261101T000000Z": consumed["history/20261101T000000Z"]}
    assert consumed["history/20261101T000000Z"]["samples"] == first[0]
    assert trainer.reader.buffers["history"].rows == 0 and not trainer.batch_feeds["history"].next_window()
    sizes = [len(ids) for _, ids in _steps(log)]
    assert sizes == [64] * (first[0] // 64) + [first[0] % 64]

    second = commit_windows(job, range(1, 3))
    Trainer(job, options).run()  # resumes; two windows available: full minibatches across them
    consumed = json.loads(paths.progress.read_text())["consumed"]
    assert [consumed[f"history/20261101T0{h}0000Z"]["samples"] for h in range(3)] == first + second
    later = [len(ids) for _, ids in _steps(log)][len(sizes) :]
    assert later == [64] * (sum(second) // 64) + ([sum(second) % 64] if sum(second) % 64 else [])
    ids = [i for _, step in _steps(log) for i in step]
    assert len(ids) == len(set(ids)) == sum(first + second)


def test_fill_leaves_the_lock_alone_only_while_nothing_waits_to_move(tiny):
    """``Inputs.nothing_staged``: staged rows, a window that started arriving, or an end-of-source flag
    not yet moved are each something to move (``fill`` takes the lock for them)."""
    _, job = tiny
    trainer = Trainer(job, TrainerOptions(poll_interval=0.01), {"realtime": [TableStreamReader(_events(job, 1))]})
    inputs = trainer.inputs
    trainer.prefetch = Prefetcher(inputs.read, inputs.lock, 0.01)  # not started: this test reads for it
    assert inputs.nothing_staged()
    with inputs.lock:
        inputs.read()  # rows staged
    assert not inputs.nothing_staged()
    trainer.fill()
    assert inputs.nothing_staged() and trainer.reader.buffers["realtime"].rows > 0
    for flag in ("exhausted", "drained"):
        flipped = not getattr(trainer.reader.buffers["history"], flag)
        setattr(inputs.staging["history"], flag, flipped)
        assert not inputs.nothing_staged()
        trainer.fill()
        assert inputs.nothing_staged() and getattr(trainer.reader.buffers["history"], flag) is flipped
    inputs.staged_seqs.append(1)
    assert not inputs.nothing_staged()
    inputs.close()


def test_deferred_wakes_wait_for_the_release():
    """With ``defer`` the trainer's wakes wait for ``release`` (its next backward pass); without, they go at once."""
    lock = threading.Lock()
    deferred = Prefetcher(lambda: False, lock, 0.01, defer=True)  # not started: the wake flags alone
    deferred.consumed()
    assert not deferred.wanted.is_set()
    deferred.release()
    assert deferred.wanted.is_set()
    deferred.wanted.clear()
    deferred.release()  # nothing deferred: no wake
    assert not deferred.wanted.is_set()
    immediate = Prefetcher(lambda: False, lock, 0.01)
    immediate.consumed()
    assert immediate.wanted.is_set()


def test_the_prefetch_thread_is_woken_at_each_backward_pass(tiny, monkeypatch):
    """One process: the stepper releases the prefetch thread's deferred wakes just before backward,
    once a step, and the hook is gone when the run ends."""
    _, job = tiny
    commit_windows(job, range(6))
    released = []
    monkeypatch.setattr(Prefetcher, "release", lambda self: released.append(self.defer))
    options = TrainerOptions(until_window="20261101T010000Z", poll_interval=0.01)
    trainer = Trainer(job, options, {"realtime": [TableStreamReader(_events(job, 6))]})
    trainer.run()
    assert trainer.step > 0 and len(released) >= trainer.step and all(released)
    assert trainer.stepper.before_backward is None


def _offline_job(tmp_path, monkeypatch, name: str):
    """An offline single-tower job over six committed windows (one buffer: the same minibatches whatever
    the threads' timing): (job, the windows' sizes)."""
    from tests.train.conftest import make_job

    _, job = make_job(tmp_path / name, monkeypatch, mode="offline", hours=6)
    return job, commit_windows(job, range(6))


def _run(job, log, ahead: bool, monkeypatch, **options):
    """A trainer's run, ``ahead`` or not: (trainer, the threads that accounted its steps)."""
    from primus_lib.train.runtime.windows import WindowAccounting

    threads: list[str] = []
    account = WindowAccounting.account

    def traced(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return account(self, *args, **kwargs)

    trainer = Trainer(job, TrainerOptions(poll_interval=0.01, idle_exit=1.0, sample_log=log, **options))
    assert trainer.ahead, "one process with the prefetch thread plans ahead by default"
    trainer.ahead = ahead
    with monkeypatch.context() as patch:
        patch.setattr(WindowAccounting, "account", traced)
        trainer.run()
    return trainer, threads


def test_the_loops_work_beside_the_step_trains_as_it_does_inline(tmp_path, monkeypatch):
    """The loop's accounting and next decision on the step's helper thread (``Trainer._after_step``) give
    the same steps, minibatches, window statistics and model, bit for bit, as the loop doing them itself."""
    from tests.train.conftest import same_state

    logs = {name: tmp_path / f"{name}.log" for name in ("beside", "inline")}
    beside, beside_threads = _run(_offline_job(tmp_path, monkeypatch, "beside")[0], logs["beside"], True, monkeypatch)
    inline, inline_threads = _run(_offline_job(tmp_path, monkeypatch, "inline")[0], logs["inline"], False, monkeypatch)
    assert set(beside_threads) == {"primus-step_0"} and set(inline_threads) == {"MainThread"}
    assert beside.step == inline.step == len(_steps(logs["beside"])) > 0
    assert _steps(logs["beside"]) == _steps(logs["inline"])
    progress = [json.loads(t.paths.progress.read_text()) for t in (beside, inline)]
    for entry in progress:
        for window in entry["consumed"].values():
            window.pop("at")
    assert progress[0]["consumed"] == progress[1]["consumed"] and len(progress[0]["consumed"]) == 6
    assert same_state(beside.stepper.state_dict(), inline.stepper.state_dict())


def test_the_minibatches_planned_beside_the_step_are_freed_there(tmp_path, monkeypatch):
    """A minibatch the helper took is freed by the helper, beside a later step's backward, not by the
    training thread between steps (~60 us a minibatch on bench/train.py's single tower)."""
    from primus_lib.train.runtime.planning import Planning

    job, _ = _offline_job(tmp_path, monkeypatch, "freed")
    taken_on: dict[int, str] = {}
    freed_on: dict[int, str] = {}
    take = Planning._take

    def traced(self, decision):
        taken = take(self, decision)
        key = len(taken_on)
        taken_on[key] = threading.current_thread().name
        weakref.finalize(taken.batch, lambda: freed_on.__setitem__(key, threading.current_thread().name))
        return taken

    monkeypatch.setattr(Planning, "_take", traced)
    _run(job, tmp_path / "ids.log", True, monkeypatch)
    gc.collect()  # the trainer: its stepper holds the last for a next step
    helpers = [key for key, name in taken_on.items() if name == "primus-step_0"]
    assert len(helpers) >= 4 and len(freed_on) == len(taken_on)
    # each at the next step; the last step's goes with the trainer
    assert [freed_on[key] for key in helpers[:-1]] == ["primus-step_0"] * (len(helpers) - 1)


def test_a_run_stopped_at_max_steps_resumes_with_every_row_once(tmp_path, monkeypatch):
    """The step before ``--max-steps`` plans no minibatch ahead (nor one before a checkpoint): the
    checkpoint keeps every row not trained, and the resumed run trains each exactly once."""
    job, sizes = _offline_job(tmp_path, monkeypatch, "run")
    ends = list(itertools.accumulate(sizes))
    size = job.spec.training.batch_size
    # a last step that completes no window and is no --checkpoint-steps checkpoint: nothing else stops the take
    last = next(s for s in range(4, 12) if s % 3 and not any((s - 1) * size < end <= s * size for end in ends))
    log = tmp_path / "ids.log"
    first, _ = _run(job, log, True, monkeypatch, max_steps=last, checkpoint_steps=3)
    assert first.step == last and len(_steps(log)) == last
    Trainer(job, TrainerOptions(poll_interval=0.01, idle_exit=1.0, sample_log=log)).run()
    ids = [i for _, step in _steps(log) for i in step]
    consumed = json.loads(first.paths.progress.read_text())["consumed"]
    assert [consumed[f"history/20261101T0{h}0000Z"]["samples"] for h in range(6)] == sizes
    assert len(ids) == len(set(ids)) == sum(sizes)
