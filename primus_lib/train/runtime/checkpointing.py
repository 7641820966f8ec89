"""The loop's checkpoints, apart from the loop: what a checkpoint holds, how one process writes it
off the training thread, and why offsets and progress.json wait for it to be durable.

A mixin of ``loop.Trainer`` (it reads the trainer's inputs, windows, coordinator and stepper):
the loop decides when to checkpoint, this decides how.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from primus_lib.train.runtime.coordinator import Coordinator, SingleProcess, Snapshot

if TYPE_CHECKING:
    from primus_lib.train.model.stepper import Stepper
    from primus_lib.train.runtime.feeds import StreamFeed
    from primus_lib.train.runtime.input_metrics import InputMetrics
    from primus_lib.train.runtime.inputs import Inputs
    from primus_lib.train.runtime.sample_log import SampleLogWriter
    from primus_lib.train.runtime.windows import WindowAccounting

log = logging.getLogger("primus.trainer")


class Checkpointing:
    """Restore, checkpoint and publish for ``loop.Trainer`` (its attributes, set by its ``__init__``)."""

    writer: ThreadPoolExecutor | None
    in_flight: tuple[Future, Snapshot] | None
    # the trainer's, read and set here
    mode: str
    rank: int
    size: int
    step: int
    last_checkpoint_step: int
    last_checkpoint_at: float
    coordinator: Coordinator
    stepper: Stepper
    inputs: Inputs
    stream_feeds: dict[str, list[StreamFeed]]
    windows: WindowAccounting
    sample_log: SampleLogWriter
    input_metrics: InputMetrics | None
    _transfer: Callable[[], bool]  # staged rows into the buffers (lock held)

    def restore(self) -> None:
        resumed = self.coordinator.restore()
        if resumed is None:
            self.sample_log.started(0)
            return
        self.stepper.load_state_dict(resumed.state)
        self.step = resumed.step
        self.inputs.seek(resumed.position, resumed.pending)
        self.windows.load(resumed.position, resumed.merged)
        self.last_checkpoint_step = self.step
        self.sample_log.started(self.step)
        log.info("rank %d resumed from %s at step %d", self.rank, resumed.path, self.step)

    def checkpoint(self, wait: bool = True) -> None:
        """Checkpoint the model with the feeds' position. ``wait=False`` (the loop, one process):
        the state is copied here and written by the writer thread while training goes on; stream
        offsets are committed and progress published only once it is durable (``settle``)."""
        if self.step == self.last_checkpoint_step:
            self.settle(block=wait)
            return
        self.settle(block=True)  # at most one in flight: published in order
        with self.inputs.lock:  # the feeds' cursors and every row they produced, together
            self._transfer()
            horizons = {name: self.inputs.stream_horizon(name) for name in self.stream_feeds}
            self.windows.close_stream_windows(horizons)
            position = {"mode": self.mode, **self.inputs.position(), **self.windows.state()}
            if self.size > 1:
                position["unmerged"] = dict(self.windows.unmerged)
            snapshot = Snapshot(self.step, position, self.inputs.pending(), horizons)
        self.last_checkpoint_step = self.step
        self.last_checkpoint_at = time.monotonic()
        self.windows.done_since_checkpoint = False
        # a world's save is a collective; a sharded model's is written from the live shards
        if wait or type(self.coordinator) is not SingleProcess or self.stepper.syncs_towers:
            self.coordinator.save(snapshot, self.stepper)
            self._publish(snapshot, self.windows.consumed)
            self._durable()
            return
        # the live dicts and tensors move on with training: the writer gets copies (Arrow is immutable)
        snapshot.position = copy.deepcopy(position)
        state = _State(_copied(self.stepper.state_dict()))
        if self.writer is None:
            self.writer = ThreadPoolExecutor(1, thread_name_prefix="primus-checkpoint", initializer=_yield_cpu)
        self.in_flight = (self.writer.submit(self._write, snapshot, state), snapshot)

    def _write(self, snapshot: Snapshot, state: _State) -> None:
        """The writer thread: the checkpoint, then what waits for it to be durable (broker commits and
        file writes that would otherwise stall training)."""
        self.coordinator.save(snapshot, state)
        self._publish(snapshot, snapshot.position["consumed"])

    def settle(self, block: bool) -> None:
        """Take note of the checkpoint in flight once it is durable and published (now, when ``block``)."""
        if self.in_flight is None or not (block or self.in_flight[0].done()):
            return
        future, _ = self.in_flight
        self.in_flight = None
        future.result()  # a failed write fails the trainer, as a synchronous one does
        self._durable()

    def _publish(self, snapshot: Snapshot, consumed: dict[str, dict]) -> None:
        """The checkpoint of ``snapshot`` is durable: commit its offsets, then progress.json."""
        self.inputs.commit(snapshot.position["stream"])  # only now is the position durable
        self.coordinator.publish(snapshot, consumed)
        self.sample_log.checkpoint(snapshot.step)

    def _durable(self) -> None:
        """After a publish, on the training thread: windows merged over ranks, the metrics snapshot."""
        self.windows.merged(self.coordinator.merged_keys)
        self.publish_metrics()

    def publish_metrics(self, last: bool = False) -> None:
        """Snapshot the input metrics (checkpoints; ``last``: the end of a run, written now)."""
        if self.input_metrics is not None:
            self.input_metrics.publish(last)


def _yield_cpu() -> None:
    """The writer thread at nice 19 (Linux: a thread's own nice value): where a core is short it yields to
    the step's helper and the prefetch thread, which the training thread waits for, and takes what they
    leave. A writer that falls behind costs no more than a synchronous save: the next checkpoint waits
    for it, and the training thread, waiting, leaves it a core. bench/train.py's ``primus train`` runs,
    2026-12-07, 8 with and 8 without, alternated: MTRM +3.5% samples/s (medians), single_tower +1.7%; the
    writer takes 40-100 ms of CPU a checkpoint there (39 MB: sha256 23 ms, torch.save 8, the write)."""
    if sys.platform == "linux":
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _copied(value: Any) -> Any:
    """A copy of a state dict for the writer thread, its tensors and arrays cloned: ``copy.deepcopy`` took
    1.7x as long on the training thread (MTRM's 39 MB state on bench/train.py: 9.3 ms against 5.4)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if type(value) is list:
        return [_copied(item) for item in value]
    return copy.deepcopy(value)


class _State:
    """A stepper's state copied at a checkpoint (what ``Coordinator.save`` asks a stepper for)."""

    syncs_towers = False  # a copy of a one-process model's state, never a sharded one's

    def __init__(self, state: dict):
        self.state = state

    def state_dict(self) -> dict:
        return self.state
