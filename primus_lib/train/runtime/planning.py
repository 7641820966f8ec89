"""One iteration's plan for the training loop (``loop.Trainer``): bring read rows into the buffers,
decide (the coordinator), take the minibatch; and, after its step, account it per window.

In one process, the loop hands this work to the step's helper thread, which does it beside the
step's backward (``_after_step``): the next iteration's minibatch is ready when the step returns.
It takes that minibatch only when the loop will step on it at once: a checkpoint or a stop first
would snapshot buffers without its rows. A mixin of ``loop.Trainer`` (its attributes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from primus_lib.spec.training import FeaturesSpec
from primus_lib.train.model.batch import Batch, Prepared, to_batch
from primus_lib.train.runtime.coordinator import Coordinator, Decision, Wants

if TYPE_CHECKING:
    from primus_lib.train.runtime.feeds import BatchFeed
    from primus_lib.train.runtime.inputs import Inputs
    from primus_lib.train.runtime.options import TrainerOptions
    from primus_lib.train.runtime.prefetch import Prefetcher
    from primus_lib.train.runtime.priority import Piece, PriorityReader
    from primus_lib.train.runtime.sample_log import SampleLogWriter
    from primus_lib.train.runtime.windows import WindowAccounting


@dataclass
class Taken:
    """A minibatch taken from a buffer for a step."""

    buffer: str
    kind: str
    rows: pa.Table | None
    batch: Batch | None
    parts: list | None  # its rows by window (``WindowAccounting.parts``)


@dataclass
class Plan:
    """One loop iteration's input and decision; ``taken``: its minibatch, when it was planned beside the
    last step and the loop will step at once (no checkpoint or stop first: those snapshot the buffers)."""

    arrived: bool
    fed: float  # perf_counter once the input was in
    decision: Decision
    checkpoint: bool
    stop: bool  # --max-steps or --until-window reached
    taken: Taken | None = None


class Planning:
    """Input, decision and accounting for ``loop.Trainer`` (its attributes, set by its ``__init__``)."""

    options: TrainerOptions
    coordinator: Coordinator
    inputs: Inputs
    reader: PriorityReader
    windows: WindowAccounting
    sample_log: SampleLogWriter
    prefetch: Prefetcher | None
    features: FeaturesSpec
    ids_column: str | None
    batch_feeds: dict[str, BatchFeed]
    until_keys: list[str]
    checkpoint_every_s: float | None
    last_checkpoint_at: float
    last_checkpoint_step: int
    idle_since: float

    # -- input --------------------------------------------------------------------------
    def fill(self) -> bool:
        """Bring read rows into the buffers; True when any arrived.

        With the prefetch thread this only waits for the lock when no buffer holds a full
        minibatch (true starvation; a drained remainder also waits, so that the flag it is
        flushed on is current); otherwise it reads inline.
        """
        lock = self.inputs.lock
        if self.prefetch is None:
            with lock:
                self.inputs.read()
                return self._transfer()
        self.prefetch.check()
        full = self.inputs.any_full()
        if full and self.inputs.nothing_staged():  # the common case: train on, no lock taken
            return False
        if not full:
            self.prefetch.release()  # starved: a deferred wake goes now
        if not lock.acquire(blocking=not full):
            return False
        try:
            moved = self._transfer()
        finally:
            lock.release()
        if moved and self.prefetch.prepare is not None:
            self.prefetch.consumed()  # new minibatches to prepare
        return moved

    def _transfer(self) -> bool:
        """Staged rows into the buffers, new batch windows into the accounting (lock held)."""
        moved = any(s.rows for s in self.inputs.staging.values())
        for feed, seq in self.inputs.transfer():
            self.windows.expect(feed, seq)
        return moved

    def wants(self, idle: bool) -> Wants:
        due = bool(self.checkpoint_every_s and time.monotonic() - self.last_checkpoint_at >= self.checkpoint_every_s)
        return Wants(
            checkpoint=self.windows.done_since_checkpoint or due,
            done=self.inputs.all_done(),
            idle=idle and self.options.idle_exit is not None,
            until=self.until_reached(),
        )

    def _take(self, decision: Decision) -> Taken:
        """The decision's minibatch out of its buffer, as the prefetch thread prepared it or built now."""
        assert decision.buffer is not None
        buffer = self.reader.buffers[decision.buffer]
        rows, piece = self.reader.take(buffer.name, decision.take) if decision.take else (None, None)
        if self.prefetch is not None and buffer.rows + self.inputs.staging[buffer.name].rows < self.inputs.high:
            self.prefetch.consumed()  # room below the read-ahead: the prefetch thread reads again
        if piece is not None and (prepared := piece.prepared) is not None:
            return Taken(buffer.name, buffer.kind, rows, prepared.batch, prepared.parts)
        if rows is None:
            return Taken(buffer.name, buffer.kind, None, None, None)
        source = piece.cut if piece is not None else rows
        batch = to_batch(source, self.features, self.ids_column)
        parts = self.windows.parts(buffer.kind, source, batch.ts) if batch.size else None
        return Taken(buffer.name, buffer.kind, rows, batch, parts)

    def _account(self, step: int, taken: Taken, probs) -> None:
        """A trained minibatch into its windows' statistics and completion, and the sample log."""
        batch = taken.batch
        assert batch is not None
        labels = batch.labels.numpy()
        self.windows.account(taken.buffer, taken.kind, taken.rows, batch.ts, labels, probs, taken.parts)
        if self.sample_log.enabled and (sample_ids := batch.ids) is not None:
            self.sample_log.step(step, taken.buffer, sample_ids)

    def _after_step(self, steps: int, taken: Taken, probs) -> Plan:
        """The loop's work on a step, on the step's helper thread while backward and the update run (the
        training thread touches none of it until it waits for this plan, at the next iteration): account
        the step, then plan the next iteration as ``loop`` would (``steps``: the count after this step),
        taking its minibatch unless a checkpoint or a stop comes first."""
        self._account(steps, taken, probs)
        plan = self._plan(steps)
        if plan.decision.buffer is not None and not (plan.checkpoint or plan.stop):
            plan.taken = self._take(plan.decision)
        return plan

    def _plan(self, steps: int) -> Plan:
        """Bring read rows in and decide (``steps``: the steps taken, for ``--checkpoint-steps`` and ``--max-steps``)."""
        options = self.options
        arrived = self.fill()
        fed = time.perf_counter()
        if arrived:
            self.idle_since = time.monotonic()
        idle = options.idle_exit is not None and time.monotonic() - self.idle_since > options.idle_exit
        decision = self.coordinator.decide(self.inputs, self.wants(idle))
        every = options.checkpoint_steps
        checkpoint = decision.checkpoint or bool(every and steps - self.last_checkpoint_step >= every)
        stop = (options.max_steps is not None and steps >= options.max_steps) or decision.until
        return Plan(arrived, fed, decision, checkpoint, stop)

    def prepare(self, kind: str, piece: Piece) -> Prepared:
        """A minibatch's tensors and windows (the prefetch thread, ``PriorityReader.prepare_next``)."""
        batch = to_batch(piece.cut, self.features, self.ids_column)
        return Prepared(batch, int(batch.ts.max()), self.windows.parts(kind, piece.cut, batch.ts))

    def until_reached(self) -> bool:
        until = self.options.until_window
        if until is None:
            return False
        if self.batch_feeds:
            return all(key in self.windows.consumed for key in self.until_keys)
        marks = [f.watermark_ms for f in self.inputs.all_stream_feeds()]
        limits = self.inputs.limits
        return (
            bool(marks)
            and limits.until_ms is not None
            and max(marks) >= limits.until_ms + limits.window_ms
            and not any(b.rows for b in self.reader.buffers.values())
        )
