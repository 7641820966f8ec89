"""The training loop, one for every world size: ``primus train`` alone or under torchrun.

Each iteration: bring read rows into the buffers (``inputs.py``), let the coordinator decide
what every rank does (``coordinator.py``: which buffer's minibatch, checkpoint, stop), run
the step (``train/model/stepper.py``), account it per window (``windows.py``), checkpoint
(``checkpointing.py``). In one process the loop's own work on a step (its accounting, then the
next iteration's input, decision and minibatch: ``planning.py``) runs on the step's helper thread
beside its backward, which frees the GIL: the training thread goes from step to step.

Exactly-once: a checkpoint holds model, optimizers, the feeds' cursors and the rows read but
not yet trained; resuming restores all of them. Stream offsets are committed to the source
only after the checkpoint that covers them is durable. A single process copies that state and
lets a writer thread write it while it trains on (the write and fsyncs were 5-10% of the loop);
offsets and progress.json wait for the write, a world of ranks saves synchronously.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, cast

from prometheus_client import CollectorRegistry

from primus_lib.data.stream import StreamReader
from primus_lib.data.training_queue import TrainingQueue
from primus_lib.paths import JobPaths, parse_window_id
from primus_lib.progress import progress_key
from primus_lib.spec.job import PrimusJob
from primus_lib.timegrid import epoch_ms
from primus_lib.train.distributed.group import Group
from primus_lib.train.distributed.ranks import open_rank_stream_readers
from primus_lib.train.model.modes import check_mode, default_switch, max_lag, reads, switches
from primus_lib.train.model.objective import StepConfig
from primus_lib.train.model.stepper import LocalStepper, Stepper, make_stepper
from primus_lib.train.runtime.checkpointing import Checkpointing
from primus_lib.train.runtime.coordinator import Coordinator, Decision, SingleProcess, Snapshot
from primus_lib.train.runtime.feeds import open_stream_readers
from primus_lib.train.runtime.feeds import stream_readers as choose_stream_readers
from primus_lib.train.runtime.inputs import Inputs, Limits
from primus_lib.train.runtime.options import TrainerOptions
from primus_lib.train.runtime.planning import Plan, Planning, Taken
from primus_lib.train.runtime.prefetch import Prefetcher
from primus_lib.train.runtime.sample_log import SampleLogWriter
from primus_lib.train.runtime.windows import WindowAccounting

if TYPE_CHECKING:
    from primus_lib.train.runtime.input_metrics import InputMetrics

log = logging.getLogger("primus.trainer")


class Trainer(Checkpointing, Planning):
    """One trainer process: its inputs, its model, the coordinator of its world, the loop."""

    def __init__(
        self,
        job: PrimusJob,
        options: TrainerOptions,
        stream_readers: dict[str, list[StreamReader]] | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        *,
        stepper=None,
        coordinator: Coordinator | None = None,
        queue: TrainingQueue | None = None,
    ):
        """``stepper``, ``coordinator`` and ``queue`` replace the job's own (the backtest's world)."""
        self.job, self.options = job, options
        self.mode = check_mode(options.mode or job.spec.training.mode)
        self.paths = JobPaths.for_job(job)
        self.registry = registry or CollectorRegistry()
        group = Group()
        self.rank, self.size = group.rank, group.size
        # under torchrun with dmp tables (a trainer with GPUs by default): TorchRec DMP (sharded.py)
        self.stepper: Stepper = stepper or make_stepper(job, StepConfig.resolve(job, mode=self.mode), group)
        if not self.stepper.syncs_towers:
            group.broadcast_params(self.stepper.model)
        spec = job.spec
        window_ms = int(spec.timer.window_size.total_seconds() * 1000)
        self.coordinator: Coordinator = coordinator or self._coordinator(group, window_ms, clock)
        self.features = spec.features
        self.id_column = spec.features.id or _first_key(job)
        self.ids_column: str | None = None  # row ids: the sample log, MTRM's validation, the once rule
        switch = options.switch_at or default_switch(job)
        limits = Limits(
            until_ms=epoch_ms(parse_window_id(options.until_window)) if options.until_window else None,
            switch_ms=epoch_ms(switch) if switches(self.mode) else None,
            lag_ms=int(max_lag(job).total_seconds() * 1000),
            end_ms=epoch_ms(spec.timer.end) if spec.timer.end is not None else None,
            window_ms=window_ms,
        )
        readers = stream_readers
        if readers is None and reads(self.mode, "stream"):
            rank_readers = lambda j: open_rank_stream_readers(j, self.rank, self.size)  # noqa: E731
            direct = rank_readers if group.active else open_stream_readers
            readers = choose_stream_readers(job, direct, self.rank, self.size)
        grace = options.flush_grace if options.flush_grace is not None else options.poll_interval
        if queue is None and reads(self.mode, "batch"):
            queue = TrainingQueue(self.paths.ledger)
        self.inputs = Inputs(
            job,
            self.mode,
            limits,
            readers or {},
            self.registry,
            rank=self.rank,
            size=self.size,
            high_water=options.high_water,
            flush_grace=grace,
            queue=queue,
            where=self.paths.locate,
            clock=clock,
        )
        self.coordinator.attach(self.inputs)
        self.batch_feeds, self.stream_feeds = self.inputs.batch_feeds, self.inputs.stream_feeds
        until = options.until_window
        self.until_keys = [progress_key(name, until) for name in self.batch_feeds] if until else []
        self.reader = self.inputs.reader
        self.windows = WindowAccounting(window_ms, stream_only=not self.batch_feeds, keep_raw=group.active)
        self.prefetch: Prefetcher | None = None
        # one process: the prefetch thread prepares minibatches (a world's per-rank takes are not whole)
        self.prepares = bool(options.prefetch) and type(self.coordinator) is SingleProcess
        if self.prepares:
            self.inputs.align()
        self.decision: Decision | None = None  # what the loop decided, for train_one
        self.taken: Taken | None = None  # its minibatch, when planned beside the last step
        # one process: the loop's work on a step runs beside its backward (``_after_step``)
        self.ahead = self.prepares and isinstance(self.stepper, LocalStepper)
        self.planned: Future[Plan] | None = None  # the next iteration, planned beside the last step
        self.idle_since = time.monotonic()
        self.step = 0
        self.last_checkpoint_step = -1
        self.last_checkpoint_at = time.monotonic()
        self.writer: ThreadPoolExecutor | None = None  # writes the loop's checkpoints (one process)
        self.in_flight: tuple[Future, Snapshot] | None = None
        interval = spec.training.checkpoint_interval
        self.checkpoint_every_s = interval.total_seconds() if interval else None
        self.sample_log = SampleLogWriter(options.sample_log, self.rank if group.active else None)
        if self.sample_log.enabled or self.stepper.config.needs_ids:
            self.ids_column = self.inputs.ids = self.id_column
        self.input_metrics = self._input_metrics()  # the scaler's trainer signals (input_metrics.py)
        self.step_delay = options.step_delay

    def _coordinator(self, group: Group, window_ms: int, clock: Callable[[], float]) -> Coordinator:
        checkpoints, progress = self.paths.checkpoints, self.paths.progress
        if not group.active:
            return SingleProcess(self.mode, checkpoints, progress)
        from primus_lib.train.distributed.data_parallel import DataParallel

        return DataParallel(self.mode, checkpoints, progress, group, window_ms, clock)

    def _input_metrics(self) -> InputMetrics | None:
        """The trainer's InputMetrics, or None when they cannot be set up (metrics never stop training)."""
        if not self.options.metrics:
            return None
        try:
            from primus_lib.metrics.reporting import report_every
            from primus_lib.train.runtime.input_metrics import InputMetrics

            return InputMetrics(
                self.job.name,
                self.rank,
                self.registry,
                self.paths.metrics_dir,
                self.inputs.queues_full,
                every=report_every(self.job),
            )
        except Exception as exc:  # metrics never stop training
            log.warning("trainer metrics disabled: %s: %s", type(exc).__name__, exc)
            return None

    # -- training -----------------------------------------------------------------------
    def train_one(self) -> bool:
        """One step of the buffer the loop's decision names (decided now outside the loop)."""
        decision, self.decision = self.decision, None
        taken, self.taken = self.taken, None
        if decision is None:
            decision = self.coordinator.decide(self.inputs, self.wants(False))
        if decision.buffer is None:
            return False
        if taken is None:
            taken = self._take(decision)
        batch, stepper = taken.batch, self.stepper
        if self.ahead and batch is not None and isinstance(stepper, LocalStepper):  # one process
            result = stepper.step(taken.kind, batch, then=functools.partial(self._after_step, self.step + 1, taken))
        else:
            result = self.coordinator.step(stepper, taken.kind, batch, decision.global_rows)
        self.step += 1
        if batch is None or result is None:
            return True
        if self.input_metrics is not None:
            self.input_metrics.add_samples(batch.size)
        if result.then is not None:
            self.planned = result.then
        else:
            self._account(self.step, taken, result.probs)
        return True

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> str:
        self.windows.done_since_checkpoint = False
        try:
            self.restore()
            if self.options.prefetch:
                self._start_prefetch()
            try:
                self.loop()
            finally:
                if self.planned is not None:  # stopped between a step and its plan's join: the plan ends first
                    self.planned.exception()
                    self.planned = None
                if self.prefetch is not None:
                    self.prefetch.stop()
                    self.stepper.before_backward = None
            self.checkpoint()
            self.publish_metrics(last=True)
        finally:  # on failure too (offsets are committed only by checkpoints, never by close)
            if self.writer is not None:  # a write in flight completes (durable, never published)
                self.writer.shutdown(wait=True)
            if self.input_metrics is not None:
                self.input_metrics.close()
            self.inputs.close()
        done = [k for k in self.coordinator.consumed(self.windows.consumed) if "/" in k]
        who = f" rank {self.rank}/{self.size}" if self.size > 1 else ""
        return (
            f"trainer {self.job.name} ({self.mode}){who}: step {self.step}, {len(done)} windows consumed, "
            f"served {self.reader.served}, on {getattr(self.stepper, 'device', 'cpu')}"  # a sharded model's GPU
        )

    def _start_prefetch(self) -> None:
        """The prefetch thread; in one process the stepper wakes it at each backward pass. It prepares
        minibatches only where the loop does not plan ahead: a planned minibatch is built on the step's
        helper beside backward, and a second thread building them ran over into the next step's forward
        (bench/train.py, single_tower: 5-10% more samples/s without it, MTRM within its noise)."""
        prepare = self.prepares and not self.ahead
        self.prefetch = Prefetcher(
            self.inputs.read,
            self.inputs.lock,
            self.options.poll_interval,
            full=self.inputs.queues_full,
            prepare=self.reader.prepare_next(self.prepare) if prepare else None,
            defer=self.prepares,
        )
        if self.prepares:
            self.stepper.before_backward = self.prefetch.release
        self.prefetch.start()

    def loop(self) -> None:
        options = self.options
        im = self.input_metrics
        began = fed = time.perf_counter()
        stepped = full = False
        last: Plan | None = None
        while True:
            if im is not None:  # the previous iteration, then this one's start (live: only read without a step)
                im.end(began, fed, stepped, full, live=not stepped and self.inputs.stream_live())
                began = im.begin()
            plan: Plan | None = None
            if self.planned is not None:  # planned beside the last step: waiting for it is input wait
                if last is not None:  # its minibatch: freed on the next step's helper, not between steps
                    cast(LocalStepper, self.stepper).release(last)
                planned, self.planned = self.planned, None
                plan = planned.result()
                plan.fed = time.perf_counter()
            last = None
            if im is not None:
                full = im.queues_full()
            if self.in_flight is not None:
                self.settle(block=False)
            if plan is None:
                plan = self._plan(self.step)
            fed, decision, stepped = plan.fed, plan.decision, False
            if plan.checkpoint:
                self.checkpoint(wait=False)
            if plan.stop:
                break
            if decision.buffer is not None:
                self.decision, self.taken = decision, plan.taken
                last = plan
                stepped = self.train_one()
                self.idle_since = time.monotonic()
                if self.step_delay:
                    time.sleep(self.step_delay)
                continue
            if decision.done:
                break
            if decision.idle:
                log.info("no new data%s for %.0fs: exiting", " on any rank" if self.size > 1 else "", options.idle_exit)
                break
            if self.prefetch is not None:
                self.prefetch.release()  # no step: no backward pass to wait for
            if not plan.arrived:
                pause = options.poll_interval if self.prefetch is None else min(options.poll_interval, 0.01)
                time.sleep(max(0.001, pause))


def _first_key(job: PrimusJob) -> str | None:
    from primus_lib.data.schema import job_keys

    keys = job_keys(job)
    return keys[0] if keys else None
