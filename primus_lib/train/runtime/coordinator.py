"""What the ranks of a trainer must agree on, behind one interface, so that the training loop
(``loop.py``) is the same code for one process and for a torchrun world:

- ``watermark``: where the stream is in time (the batch-lag gate);
- ``decide``: which kind of step everybody takes now (the priority rule over the buffers),
  how many rows each takes, and whether everybody is done, idle, at ``--until-window``, or
  wants a checkpoint;
- ``step``: one Algorithm 1 step (a data-parallel one all-reduces the touched rows and the
  gradients of the tower the step updates);
- ``save`` / ``publish`` / ``restore``: checkpoints (barriers in a world of several ranks).

``SingleProcess`` decides locally; ``data_parallel.DataParallel`` over torch.distributed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import pyarrow as pa

from primus_lib.progress import write_progress
from primus_lib.storage import Where
from primus_lib.train.checkpoint.store import check_checkpoint, load_latest, save_checkpoint
from primus_lib.train.model.batch import Batch
from primus_lib.train.model.objective import StepResult
from primus_lib.train.runtime.inputs import Inputs


@dataclass
class Wants:
    """What this process would do on its own, before the ranks agree."""

    checkpoint: bool
    done: bool
    idle: bool
    until: bool


@dataclass
class Decision:
    """What every rank does this iteration."""

    buffer: str | None  # the buffer to step (None: no step)
    take: int  # rows this process takes from it (0: it joins with none)
    global_rows: int  # rows of the step over every rank
    checkpoint: bool
    done: bool
    idle: bool
    until: bool


@dataclass
class Snapshot:
    """One process's part of a checkpoint, captured under the inputs' lock."""

    step: int
    position: dict  # mode, feed cursors, window statistics
    pending: dict[str, pa.Table | None]  # rows read, not trained
    horizons: dict[str, int] = field(default_factory=dict)  # per stream: event time trained up to


@dataclass
class Resumed:
    """What a process resumes from: the model state, its own position and unread rows."""

    path: str  # the checkpoint's URI, for the log (a world's other ranks learn it from rank 0)
    step: int
    state: dict
    position: dict
    pending: dict[str, pa.Table | None]
    merged: set[str] | None = None  # data-parallel: windows already summed over ranks


class Coordinator(ABC):
    """The agreement between the ranks of one trainer (a world of one agrees with itself)."""

    rank = 0
    size = 1

    def __init__(self, mode: str, checkpoints: Where, progress: Where):
        self.mode = mode
        self.checkpoints = checkpoints
        self.progress = progress
        self.merged_keys: list[str] = []  # windows the last checkpoint summed over ranks

    @abstractmethod
    def attach(self, inputs: Inputs) -> None:
        """Called once the inputs exist (a data-parallel world installs its agreed watermark)."""

    @abstractmethod
    def decide(self, inputs: Inputs, wants: Wants) -> Decision: ...

    @abstractmethod
    def step(self, stepper, kind: str, batch: Batch | None, global_rows: int) -> StepResult | None: ...

    @abstractmethod
    def save(self, snapshot: Snapshot, stepper) -> None:
        """Write the checkpoint (durable when this returns, on every rank)."""

    @abstractmethod
    def publish(self, snapshot: Snapshot, consumed: dict[str, dict]) -> None:
        """progress.json, after the stream offsets are committed."""

    @abstractmethod
    def restore(self) -> Resumed | None: ...

    def consumed(self, local: dict[str, dict]) -> dict[str, dict]:
        """The windows consumed by the whole trainer, as this process knows them."""
        return local


class SingleProcess(Coordinator):
    """A world of one: every decision is this process's own."""

    def attach(self, inputs: Inputs) -> None:
        """The inputs gate the batch on their own stream (``Inputs.local_watermark``)."""

    def decide(self, inputs: Inputs, wants: Wants) -> Decision:
        reader = inputs.reader
        only = set(inputs.batch_feeds) if self._batch_phase(inputs) else None
        buffer = reader.choose(only)
        take = min(inputs.batch_size, buffer.rows) if buffer is not None else 0
        name = buffer.name if buffer is not None else None
        return Decision(name, take, take, wants.checkpoint, wants.done, wants.idle, wants.until)

    def _batch_phase(self, inputs: Inputs) -> bool:
        """offline_then_online: the stream is served only once the batch phase is finished."""
        return inputs.limits.switch_ms is not None and not inputs.batch_phase_over()

    def step(self, stepper, kind: str, batch: Batch | None, global_rows: int) -> StepResult | None:
        if batch is None:
            return None
        # a sharded model (DMP on one GPU: a world of one) is told the step's rows, as in a world of several
        return stepper.step(kind, batch, global_rows) if stepper.syncs_towers else stepper.step(kind, batch)

    def save(self, snapshot: Snapshot, stepper) -> None:
        # a sharded model writes its tables through torch.distributed.checkpoint; the state names them
        state = stepper.checkpoint_state(snapshot.step) if stepper.syncs_towers else stepper.state_dict()
        save_checkpoint(self.checkpoints, snapshot.step, state, snapshot.position, snapshot.pending)

    def publish(self, snapshot: Snapshot, consumed: dict[str, dict]) -> None:
        write_progress(self.progress, consumed, snapshot.step, snapshot.position["stream"], self.mode)

    def restore(self) -> Resumed | None:
        ckpt = load_latest(self.checkpoints)
        if ckpt is None:
            return None
        check_checkpoint(ckpt.path, ckpt.position, self.mode, 1)
        return Resumed(str(ckpt.path), ckpt.step, ckpt.state, ckpt.position, dict(ckpt.pending))
