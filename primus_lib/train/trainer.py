"""The trainer process: buffers fed from the training queue and the streams, the priority
rule, Algorithm 1 steps, checkpoints that hold the data position, progress.json.

Batch-lag rule: a batch window ``[s, s+w)`` is read only once the stream's position (the
newest event time read, or the clock once every source has caught up) has reached
``s + lag``, i.e. while the stream is at window ``t`` only batch windows up to ``t - lag``
are trained, as production sees it. With no stream in the mode, or once a bounded stream
has ended, the rule is off.

Window completion: a batch window's last rows usually do not fill a minibatch. They are
trained with the next window's rows when that window is available; when it is not (not in
the queue yet, or held back by the batch-lag rule, ``until``, the timer end) and every
buffered row's window has been read completely, the buffer is *drained* and the rows go as
one smaller minibatch, so the window is consumed, checkpointed and listed in progress.json
without waiting for the next window. The flush waits ``flush_grace`` (one poll interval by
default) with nothing new read, so a window committed a moment later still merges into full
minibatches.

Exactly-once: a checkpoint holds model, optimizers, the feeds' cursors and the rows read but
not yet trained; resuming restores all of them. Stream offsets are committed to the source
only after the checkpoint that covers them is durable.

Under torchrun with several ranks the same Trainer reads its rank's share of the data and
``data_parallel.DataParallel`` runs the loop, the steps and the checkpoints in lockstep.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow.compute as pc
import torch
from prometheus_client import CollectorRegistry

from primus_lib.data.stream import StreamReader
from primus_lib.data.training_queue import QueuedWindow, TrainingQueue
from primus_lib.paths import JobPaths, parse_window_id, window_id
from primus_lib.progress import progress_key, window_summary, write_progress
from primus_lib.spec.job import PrimusJob
from primus_lib.timegrid import epoch_ms, from_epoch_ms
from primus_lib.train.batch import to_batch
from primus_lib.train.checkpoint import check_checkpoint, load_latest, save_checkpoint
from primus_lib.train.feeds import SEQ_COLUMN, BatchFeed, StreamFeed
from primus_lib.train.metrics import WindowStats
from primus_lib.train.prefetch import Prefetcher
from primus_lib.train.priority import Buffer, PriorityReader
from primus_lib.train.ranks import open_rank_stream_readers
from primus_lib.train.sharded import make_stepper

log = logging.getLogger("primus.trainer")

READS_BATCH = {"mtrm", "single_tower", "offline", "offline_then_online"}
READS_STREAM = {"mtrm", "single_tower", "online", "offline_then_online"}


@dataclass
class TrainerOptions:
    until_window: str | None = None
    max_steps: int | None = None
    mode: str | None = None
    poll_interval: float = 2.0
    checkpoint_steps: int | None = None
    idle_exit: float | None = None
    switch_at: datetime | None = None  # offline_then_online; default default_switch(job)
    sample_log: Path | None = None  # test aid: consumed sample ids per step
    high_water: int = 4  # minibatches a buffer reads ahead
    prefetch: bool = True  # read the feeds in a background thread
    step_delay: float = 0.0  # test aid (PRIMUS_TRAIN_STEP_DELAY): sleep after each step
    flush_grace: float | None = None  # seconds a drained batch feed waits before a partial step; None: poll_interval


def max_lag(job: PrimusJob) -> timedelta:
    """The largest lag of the job's batch streams (zero without any)."""
    return max((s.lag for s in job.batch_streams), default=timedelta(0))


def default_switch(job: PrimusJob) -> datetime:
    """offline_then_online switches to the stream one day after the first batch window exists."""
    return job.spec.timer.start + max_lag(job) + timedelta(days=1)


class Trainer:
    def __init__(
        self,
        job: PrimusJob,
        options: TrainerOptions,
        stream_readers: dict[str, list[StreamReader]] | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ):
        from primus_lib.train.data_parallel import DataParallel
        from primus_lib.train.distributed import Group

        self.group = Group()
        self.job = job
        self.options = options
        self.clock = clock
        self.mode = options.mode or job.spec.training.mode
        self.paths = JobPaths.for_job(job)
        spec = job.spec
        self.features = spec.features
        self.batch_size = spec.training.batch_size
        self.window_ms = int(spec.timer.window_size.total_seconds() * 1000)
        rank, size = self.group.rank, self.group.size
        # $PRIMUS_SHARDING=dmp under torchrun: tables sharded by TorchRec DMP (sharded.py)
        self.stepper = make_stepper(job, mode=self.mode, group=self.group)
        if not getattr(self.stepper, "sharded", False):  # the sharded stepper syncs its towers itself
            self.group.broadcast_params(self.stepper.model)
        self.registry = registry or CollectorRegistry()
        self.id_column = spec.features.id or job_keys_first(job)
        switch = options.switch_at or default_switch(job)
        self.switch_ms = epoch_ms(switch) if self.mode == "offline_then_online" else None
        self.lag_ms = int(max_lag(job).total_seconds() * 1000)  # the largest batch stream lag
        weights = spec.training.priority
        buffers: list[Buffer] = []
        self.batch_feeds: dict[str, BatchFeed] = {}
        self.stream_feeds: dict[str, list[StreamFeed]] = {}
        if self.mode in READS_BATCH:
            queue = TrainingQueue(self.paths.ledger)
            for stream in job.batch_streams:
                self.batch_feeds[stream.name] = BatchFeed(
                    queue, stream.name, stream.lag, self.features.timestamp, rank, size
                )
                buffers.append(Buffer(stream.name, "batch", weights.get(stream.name, 1.0), self.features.timestamp))
        if self.mode in READS_STREAM:
            if stream_readers is not None:
                readers = stream_readers
            elif self.group.active:
                readers = open_rank_stream_readers(job, rank, size)
            else:
                readers = open_stream_readers(job)
            keep_from = self.switch_ms - self.lag_ms if self.switch_ms is not None else None
            for stream in job.stream_streams:
                self.stream_feeds[stream.name] = [
                    StreamFeed(stream.name, r, self.features.timestamp, keep_from) for r in readers.get(stream.name, [])
                ]
                buffers.append(Buffer(stream.name, "stream", weights.get(stream.name, 1.0), self.features.timestamp))
        self.reader = PriorityReader(buffers, self.batch_size, self.registry)
        self.staging = {b.name: Buffer(b.name, b.kind, b.weight, b.ts_column) for b in buffers}
        self.staged_seqs: list[int] = []
        self.stalled_since: dict[str, float | None] = {name: None for name in self.batch_feeds}
        self.flush_grace = options.flush_grace if options.flush_grace is not None else options.poll_interval
        self.lock = threading.Lock()
        self.prefetch: Prefetcher | None = None
        self.step = 0
        self.stats: dict[str, WindowStats] = {}  # "<stream>/<window-id>" -> progressive stats
        self.consumed: dict[str, dict] = {}
        self.seq_rows: dict[int, list] = {}  # batch seq -> [key, expected rows, trained rows]
        self.last_checkpoint_step = -1
        self.last_checkpoint_at = time.monotonic()
        self.windows_done_since_checkpoint = False
        self.stream_window = -1  # newest stream window trained (stream-only checkpoint trigger)
        interval = spec.training.checkpoint_interval
        self.checkpoint_every_s = interval.total_seconds() if interval else None
        self.sample_log = options.sample_log or _env_path("PRIMUS_TRAIN_SAMPLE_LOG")
        if self.sample_log is not None and self.group.active:
            self.sample_log = self.sample_log.with_name(f"{self.sample_log.name}.rank{rank}")
        self.unmerged: dict[str, dict] = {}  # data-parallel: this rank's raw stats of windows it finished
        self.dp = DataParallel(self) if self.group.active else None
        self.input_metrics = open_input_metrics(self)  # the scaler's trainer signals (input_metrics.py)
        self.step_delay = options.step_delay or float(os.environ.get("PRIMUS_TRAIN_STEP_DELAY", "0"))
        self.until_ms = epoch_ms(parse_window_id(options.until_window)) if options.until_window else None

    # -- data ---------------------------------------------------------------------------
    def watermark_ms(self) -> int | None:
        """Where the stream is in time; None when no stream gates the batch.

        The newest event time read; once every source has caught up (a poll found nothing
        new), the stream's present is the clock, so a stream that simply has no newer events
        (a finished demo topic, a quiet night) does not hold the batch back forever.
        """
        if self.dp is not None:  # the stream's position over all ranks (agreed each iteration)
            return self.dp.watermark_ms()
        feeds = [f for fs in self.stream_feeds.values() for f in fs]
        if not feeds or self.mode == "offline_then_online" or all(f.ended() for f in feeds):
            return None
        mark = max(f.watermark_ms for f in feeds)
        if all(f.caught_up for f in feeds):
            mark = max(mark, int(self.clock() * 1000))
        return mark

    def admit(self, window: QueuedWindow) -> bool:
        start = epoch_ms(parse_window_id(window.window))
        if self.until_ms is not None and start > self.until_ms:
            return False
        if self.switch_ms is not None and start >= self.switch_ms - self.lag_ms:
            return False  # offline_then_online: the stream takes over from here
        end = self.job.spec.timer.end
        return end is None or start < epoch_ms(end)

    def read_inputs(self) -> bool:
        """Read from the feeds into the staging buffers up to the high-water mark.

        Runs in the prefetch thread (or inline), always under ``self.lock``: a feed's
        cursor and the rows it produced are staged together, so a checkpoint (which takes
        the lock) never sees one without the other.
        """
        arrived = False
        high = self.options.high_water * self.batch_size
        for name, feeds in self.stream_feeds.items():
            staged = self.staging[name]
            for feed in feeds:
                while staged.rows + self.reader.buffers[name].rows < high:
                    table = feed.read(high, 0.05)
                    if table is None:
                        break
                    staged.push(table)
                    arrived = True
            # a rank that owns no partition of the stream will never read any of it
            staged.exhausted = all(f.ended() for f in feeds) if feeds else self.group.active
        mark = self.watermark_ms()
        for name, feed in self.batch_feeds.items():
            staged = self.staging[name]
            got = stalled = False
            while staged.rows + self.reader.buffers[name].rows < high:
                table = feed.read(lambda at: mark is None or mark >= at, self.admit)
                if table is None:  # nothing may be read now; stalled if no window is half read
                    stalled = feed.seq == feed.done_seq
                    break
                self.staged_seqs.append(feed.seq)
                staged.push(table)
                arrived = got = True
            staged.exhausted = self._batch_finished(feed)
            staged.drained = self._drained(name, stalled, got)
        return arrived

    def _drained(self, name: str, stalled: bool, got: bool) -> bool:
        """Every row read of stream ``name`` belongs to a fully read window and no further
        window could be read for ``flush_grace`` seconds: its remainder may go as a partial step."""
        now = time.monotonic()
        if not stalled:
            self.stalled_since[name] = None
            return False
        since = self.stalled_since[name]
        if got or since is None:  # the grace period runs from the last row read
            self.stalled_since[name] = since = now
        return now - since >= self.flush_grace

    def transfer(self) -> bool:
        """Move staged rows into the training buffers (caller holds ``self.lock``)."""
        moved = False
        for seq in self.staged_seqs:
            for feed in self.batch_feeds.values():
                self._expect(feed, seq)
        self.staged_seqs.clear()
        for name, staged in self.staging.items():
            buffer = self.reader.buffers[name]
            while staged.chunks:
                buffer.push(staged.chunks.popleft())
                moved = True
            staged.rows = 0
            buffer.exhausted = staged.exhausted
            buffer.drained = staged.drained
        return moved

    def fill(self) -> bool:
        """Bring read rows into the buffers; True when any arrived.

        With the prefetch thread this only waits for the lock when no buffer holds a full
        minibatch (true starvation; a drained remainder also waits, so that the flag it is
        flushed on is current); otherwise it reads inline.
        """
        if self.prefetch is None:
            with self.lock:
                self.read_inputs()
                return self.transfer()
        self.prefetch.check()
        ready = any(b.full(self.batch_size) for b in self.reader.buffers.values())
        if not self.lock.acquire(blocking=not ready):
            return False
        try:
            return self.transfer()
        finally:
            self.lock.release()

    def _expect(self, feed: BatchFeed, seq: int) -> None:
        window = feed.windows.get(seq)
        if window is not None and window.seq not in self.seq_rows:
            rows = feed.expected_rows(window)
            self.seq_rows[window.seq] = [progress_key(window.stream, window.window), rows, 0]
            if rows == 0:
                self._window_done(window.seq)

    def _batch_finished(self, feed: BatchFeed) -> bool:
        window = feed.next_window()
        return window is not None and not self.admit(window) or (window is None and self._no_more_windows(feed))

    def _no_more_windows(self, feed: BatchFeed) -> bool:
        end = self.job.spec.timer.end
        last = feed.windows.get(feed.done_seq)
        if last is None:
            return False
        start = epoch_ms(parse_window_id(last.window))
        if self.until_ms is not None and start >= self.until_ms:
            return True
        return end is not None and start + self.window_ms >= epoch_ms(end)

    # -- training -----------------------------------------------------------------------
    def train_one(self) -> bool:
        chosen = self.reader.next_minibatch(self._servable())
        if chosen is None:
            return False
        buffer, rows = chosen
        batch = to_batch(rows, self.features, self.id_column)
        result = self.stepper.step(buffer.kind, batch)
        self.step += 1
        self._account(buffer, rows, batch, result)
        return True

    def _account(self, buffer: Buffer, rows, batch, result) -> None:
        """Per-window statistics, window completion and the sample log of one trained minibatch."""
        labels = batch.labels.numpy()
        if self.input_metrics is not None:
            self.input_metrics.add_samples(len(labels))
        if buffer.kind == "batch":
            seqs = rows.column(SEQ_COLUMN).to_numpy()
            for seq in set(seqs.tolist()):
                mask = seqs == seq
                entry = self.seq_rows[seq]
                self._stats(entry[0]).add(labels[mask], result.probs[mask])
                entry[2] += int(mask.sum())
                if entry[2] >= entry[1]:
                    self._window_done(seq)
        else:
            windows = batch.ts // self.window_ms
            newest = int(windows.max())
            if not self.batch_feeds and newest > self.stream_window:
                # stream-only modes: a checkpoint whenever the stream enters a new window
                self.windows_done_since_checkpoint |= self.stream_window >= 0
                self.stream_window = newest
            for w in set(windows.tolist()):
                mask = windows == w
                key = progress_key(buffer.name, window_id(from_epoch_ms(w * self.window_ms)))
                self._stats(key).add(labels[mask], result.probs[mask])
        if self.sample_log is not None and batch.ids is not None:
            with open(self.sample_log, "a", encoding="utf-8") as handle:
                handle.write(f"step {self.step} {buffer.name} {','.join(batch.ids)}\n")

    def _servable(self) -> set[str] | None:
        """offline_then_online: the stream is served only once the batch phase is finished."""
        if self.mode != "offline_then_online":
            return None
        batch = [self.reader.buffers[n] for n in self.batch_feeds]
        if all(b.exhausted and b.rows == 0 for b in batch):
            return None
        return {b.name for b in batch}

    def _stats(self, key: str) -> WindowStats:
        return self.stats.setdefault(key, WindowStats())

    def _window_done(self, seq: int) -> None:
        key = self.seq_rows.pop(seq)[0]
        self._consume(key, self.stats.pop(key, WindowStats()))
        self.windows_done_since_checkpoint = True

    def _consume(self, key: str, stats: WindowStats) -> None:
        self.consumed[key] = window_summary(stats)
        if self.group.active:  # merged over ranks into progress.json by rank 0 (data_parallel.py)
            self.unmerged[key] = stats.to_dict()

    def stream_horizon(self, name: str) -> int:
        """Event time before which every row of stream ``name`` read by this trainer is trained."""
        buffer = self.reader.buffers[name]
        pending = buffer.pending()
        if pending is not None:  # rows before the oldest untrained one are all trained
            return int(pc.min(pending.column(self.features.timestamp)).as_py())
        if buffer.exhausted:
            return 2**62
        # everything read is trained; events arrive in event-time order
        return max((f.watermark_ms for f in self.stream_feeds[name]), default=-(2**62))

    def _close_stream_windows(self) -> None:
        """A stream window is consumed once the trained rows' event time passed its end."""
        for name in self.stream_feeds:
            horizon = self.stream_horizon(name)
            for key in [k for k in self.stats if k.startswith(f"{name}/")]:
                start = epoch_ms(parse_window_id(key.split("/", 1)[1]))
                if start + self.window_ms <= horizon:
                    self._consume(key, self.stats.pop(key))

    # -- checkpoints --------------------------------------------------------------------
    def restore(self) -> None:
        ckpt = load_latest(self.paths.checkpoints)
        if ckpt is None:
            self.log_run(0)
            return
        pos = ckpt.position
        check_checkpoint(ckpt.path, pos, self.mode, 1)
        self.stepper.load_state_dict(ckpt.state)
        self.step = ckpt.step
        self.apply_position(pos, ckpt.pending)
        self.last_checkpoint_step = self.step
        self.log_run(self.step)
        log.info("resumed from %s at step %d", ckpt.path, self.step)

    def apply_position(self, pos: dict, pending: dict) -> None:
        """Seek the feeds, refill the buffers with the rows read but not trained, restore stats."""
        for name, feed in self.batch_feeds.items():
            feed.seek(pos["batch"][name])
            feed.next_window()
        for name, feeds in self.stream_feeds.items():
            for feed, saved in zip(feeds, pos["stream"][name], strict=True):
                feed.seek(saved)
        for name, table in pending.items():
            if table is not None:
                self.reader.buffers[name].push(table)
        self.stats = {k: WindowStats.from_dict(v) for k, v in pos["stats"].items()}
        self.consumed = pos["consumed"]
        self.seq_rows = {int(k): v for k, v in pos["seq_rows"].items()}
        self.reader.served.update(pos.get("served", {}))

    def checkpoint(self) -> None:
        if self.step == self.last_checkpoint_step:
            return
        with self.lock:  # the feeds' cursors and every row they produced, together
            self.transfer()
            self._checkpoint()
        self.publish_metrics()

    def publish_metrics(self) -> None:
        """Snapshot the input metrics now (checkpoints, the end of a run)."""
        if self.input_metrics is not None:
            self.input_metrics.publish()

    def position(self) -> dict:
        """This trainer's data position (caller holds ``self.lock``)."""
        return {
            "mode": self.mode,
            "batch": {n: f.position() for n, f in self.batch_feeds.items()},
            "stream": {n: [f.position() for f in fs] for n, fs in self.stream_feeds.items()},
            "stats": {k: v.to_dict() for k, v in self.stats.items()},
            "consumed": self.consumed,
            "seq_rows": self.seq_rows,
            "served": self.reader.served,
        }

    def _checkpoint(self) -> None:
        self._close_stream_windows()
        position = self.position()
        pending = {name: buffer.pending() for name, buffer in self.reader.buffers.items()}
        # Drop the tag column from nothing: pending batch rows keep __seq so accounting survives.
        save_checkpoint(self.paths.checkpoints, self.step, self.stepper.state_dict(), position, pending)
        self.last_checkpoint_step = self.step
        self.last_checkpoint_at = time.monotonic()
        for feeds in self.stream_feeds.values():
            for feed in feeds:  # only now is the position durable on our side
                feed.reader.commit(feed.position()["offsets"])
        stream_position = {n: [f.position() for f in fs] for n, fs in self.stream_feeds.items()}
        write_progress(self.paths.progress, self.consumed, self.step, stream_position, self.mode)
        self.windows_done_since_checkpoint = False

    def log_run(self, step: int) -> None:
        if self.sample_log is not None:
            with open(self.sample_log, "a", encoding="utf-8") as handle:
                handle.write(f"run {os.getpid()} resume {step}\n")

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> str:
        self.windows_done_since_checkpoint = False
        dp = self.dp
        try:
            (dp.restore if dp else self.restore)()
            if self.options.prefetch:
                self.prefetch = Prefetcher(self)
                self.prefetch.start()
            try:
                (dp.loop if dp else self._loop)()
            finally:
                if self.prefetch is not None:
                    self.prefetch.stop()
            (dp.checkpoint if dp else self.checkpoint)()
            self.publish_metrics()
        finally:  # on failure too (offsets are committed only by checkpoints, never by close)
            for feeds in self.stream_feeds.values():
                for feed in feeds:
                    feed.reader.close()
        consumed = dp.global_consumed if dp and self.group.rank == 0 else self.consumed
        done = [k for k in consumed if "/" in k]
        who = f" rank {self.group.rank}/{self.group.size}" if dp else ""
        return (
            f"trainer {self.job.name} ({self.mode}){who}: step {self.step}, {len(done)} windows consumed, "
            f"served {self.reader.served}"
        )

    def _loop(self) -> None:
        idle_since = time.monotonic()
        options = self.options
        im = self.input_metrics
        began = fed = time.perf_counter()
        trained = full = False
        while True:
            if im is not None:  # the previous iteration, then this one's start
                im.end(began, fed, trained, full)
                began, full = im.begin(), im.queues_full()
            if options.max_steps is not None and self.step >= options.max_steps:
                break
            if self._until_reached():
                break
            arrived = self.fill()
            fed = time.perf_counter()
            trained = self.train_one()
            if arrived or trained:
                idle_since = time.monotonic()
            if (
                self.windows_done_since_checkpoint
                or (options.checkpoint_steps and self.step - self.last_checkpoint_step >= options.checkpoint_steps)
                or (self.checkpoint_every_s and time.monotonic() - self.last_checkpoint_at >= self.checkpoint_every_s)
            ):
                self.checkpoint()
            if trained:
                if self.step_delay:
                    time.sleep(self.step_delay)
                continue
            if self._all_done():
                break
            if options.idle_exit is not None and time.monotonic() - idle_since > options.idle_exit:
                log.info("no new data for %.0fs: exiting", options.idle_exit)
                break
            if not arrived:
                time.sleep(
                    options.poll_interval if self.prefetch is None else max(0.001, min(options.poll_interval, 0.01))
                )

    def _until_reached(self) -> bool:
        if self.options.until_window is None:
            return False
        if self.batch_feeds:
            return all(progress_key(name, self.options.until_window) in self.consumed for name in self.batch_feeds)
        marks = [f.watermark_ms for fs in self.stream_feeds.values() for f in fs]
        return (
            bool(marks)
            and max(marks) >= self.until_ms + self.window_ms
            and not any(b.rows for b in self.reader.buffers.values())
        )

    def _all_done(self) -> bool:
        return all(b.exhausted and b.rows == 0 for b in self.reader.buffers.values()) and not any(
            s.rows for s in self.staging.values()
        )


def open_input_metrics(trainer: Trainer):
    """The trainer's InputMetrics, or None when they cannot be set up (metrics never stop training)."""
    try:
        from primus_lib.train.input_metrics import InputMetrics

        return InputMetrics(trainer)
    except Exception as exc:  # metrics never stop training
        log.warning("trainer metrics disabled: %s: %s", type(exc).__name__, exc)
        return None


def run_trainer(
    job: PrimusJob,
    options: TrainerOptions,
    stream_readers: dict[str, list[StreamReader]] | None = None,
    registry: CollectorRegistry | None = None,
) -> str:
    from primus_lib.train.distributed import maybe_init_distributed

    torch.set_num_threads(int(os.environ.get("PRIMUS_TORCH_THREADS", "1")))
    maybe_init_distributed()
    try:
        trainer = Trainer(job, options, stream_readers, registry)
        return trainer.run()
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def open_stream_readers(job: PrimusJob) -> dict[str, list[StreamReader]]:
    """Every stream source of the job through the data plane's ``open_stream``."""
    try:
        from primus_lib.data.sources import open_stream
    except ImportError as exc:
        raise RuntimeError(f"the data plane's primus_lib.data.sources.open_stream is not available: {exc}") from None
    return {s.name: [open_stream(job, s, source) for source in s.sources] for s in job.stream_streams}


def job_keys_first(job: PrimusJob) -> str | None:
    from primus_lib.data.schema import job_keys

    keys = job_keys(job)
    return keys[0] if keys else None


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None
