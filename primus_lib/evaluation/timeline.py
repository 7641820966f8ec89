"""The backtest's world: the decoded data of a time range, released to the trainer hour by hour.

``load_timeline`` reads the spec's own sources (``eval_sources``: the batch stream's partitions,
the stream's Kafka topic or file replay) and decodes every hour once (shared by every mode and
seed). ``HourlyWorld`` is
the coordinator ``primus eval`` runs the trainer loop (``loop.py``) with: whenever the trainer
can do nothing more with the data released so far, the world moves to the next hour ``t``:

1. the stream rows of ``t`` are scored by the current model's served output against the most
   complete label known (progressive validation): nothing of hour ``t`` has been trained yet;
   re-sent late clicks (a key ending in ``RESENT_CLICK_SUFFIX``) are trained on, not scored;
2. they are appended to the replayed stream (``GrowingReplay``), with their real-time labels;
3. batch window ``t - lag`` (complete labels) is committed to the run's training queue, as the
   data plane's Sink would; the trainer's batch-lag gate sees the stream at hour ``t``.

Everything else (the priority rule, the partial-window flush, the mode switch) is the trainer's.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_lib.data.schema import RESENT_CLICK_SUFFIX, job_keys
from primus_lib.data.shards import write_window
from primus_lib.data.training_queue import TrainingQueue
from primus_lib.evaluation.replay import GrowingReplay
from primus_lib.evaluation.sources import EvalInputError, eval_streams, read_batch, read_stream
from primus_lib.paths import window_id
from primus_lib.spec.job import PrimusJob
from primus_lib.timegrid import epoch_ms, window_starts
from primus_lib.train.model.batch import to_batch
from primus_lib.train.model.metrics import auc, logloss
from primus_lib.train.model.modes import two_towers
from primus_lib.train.model.objective import StepResult
from primus_lib.train.model.validation import Towers
from primus_lib.train.runtime.coordinator import Decision, SingleProcess, Wants
from primus_lib.train.runtime.inputs import Inputs

COMPLETE = "__label_complete"


@dataclass
class Timeline:
    """The decoded data of the whole range, one entry per hour."""

    hours: list[datetime]
    stream: list[pa.Table]  # per hour: stream samples + the complete label (null: a re-sent click, not scored)
    batch: list[pa.Table]  # per hour: the joined batch window
    lag_hours: int
    eval_from: int  # first scored hour index
    switch: int  # offline_then_online's switch hour index
    load_seconds: float = 0.0


def load_timeline(
    job: PrimusJob, data: Path | None, start: datetime, end: datetime, eval_from: datetime | None
) -> Timeline:
    """Read the spec's own sources over ``[start, end)``: every batch window, and the stream's rows
    (its Kafka topic from the earliest offset to the end, or its file replay) cut into hours.

    ``data`` is unused (the sources' URIs are already bound, ``${PRIMUS_DATA}`` included); kept
    for callers of the old signature.
    """
    began = time.perf_counter()
    batch_spec, stream_spec = eval_streams(job)
    window = job.spec.timer.window_size
    hours = list(window_starts(start, end, window, start))
    if not hours:
        raise EvalInputError(f"the range {start:%Y-%m-%dT%H:%M}Z..{end:%Y-%m-%dT%H:%M}Z holds no window")
    batch = read_batch(job, batch_spec, hours)
    label = job.spec.features.label
    keys: str | None = batch_spec.join.keys[0] if batch_spec.join else next(iter(job_keys(job)), None)
    events = read_stream(job, stream_spec, hours[0], hours[-1] + window)
    ts = events.column(job.spec.features.timestamp)
    stream = []
    for h, b in zip(hours, batch, strict=True):
        lo, hi = epoch_ms(h), epoch_ms(h + window)
        part = events.filter(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)))
        if keys is None:  # no key to find a row's batch label by: the stream's label is the best known
            part = part.append_column(COMPLETE, part.column(label))
        else:  # one complete label per (non-empty) key, so the join never multiplies rows
            complete = b.select([keys, label]).filter(pc.not_equal(b.column(keys), ""))
            complete = complete.group_by(keys).aggregate([(label, "max")]).rename_columns([keys, COMPLETE])
            part = part.join(complete, keys=keys, join_type="left outer", use_threads=False)
            filled = pc.fill_null(part.column(COMPLETE), part.column(label))
            resent = pc.fill_null(pc.ends_with(part.column(keys), RESENT_CLICK_SUFFIX), False)
            filled = pc.if_else(resent, pa.scalar(None, filled.type), filled)
            part = part.drop([COMPLETE]).append_column(COMPLETE, filled)
        part = part.sort_by(job.spec.features.timestamp)
        stream.append(part)
    if not any(p.num_rows for p in stream):
        raise EvalInputError(f"stream {stream_spec.name!r}: no rows between {hours[0]:%Y-%m-%dT%H:%M}Z and the end")
    lag = int(batch_spec.lag / window)
    first = hours.index(eval_from) if eval_from in hours else min(len(hours) - 1, lag + int(timedelta(days=1) / window))
    return Timeline(hours, stream, batch, lag, first, first, time.perf_counter() - began)


class WindowStore:
    """Batch windows written once as committed shards (manifest + Arrow files), per set of tables."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="primus-eval-"))
        if root is None:
            atexit.register(shutil.rmtree, self.root, True)
        self.written: dict[tuple[int, ...], tuple[list[pa.Table], Path]] = {}

    def directories(self, job: PrimusJob, timeline: Timeline) -> list[Path]:
        """One committed window directory per hour (tables held, so their ids stay theirs)."""
        key = tuple(id(t) for t in timeline.batch)
        if key not in self.written:
            base = self.root / f"windows-{len(self.written)}"
            stream = job.batch_streams[0].name
            for hour, table in zip(timeline.hours, timeline.batch, strict=True):
                wid = window_id(hour)
                write_window(
                    base / wid, table, stream=stream, window=wid, seed=0, rows_per_shard=max(table.num_rows, 1)
                )
            self.written[key] = (list(timeline.batch), base)
        base = self.written[key][1]
        return [base / window_id(h) for h in timeline.hours]


@dataclass
class Scores:
    """Progressive-validation scores of one run, and its steps per kind."""

    windows: list[dict] = field(default_factory=list)  # per scored hour: auc/logloss/samples (+ each tower's auc)
    labels: list[np.ndarray] = field(default_factory=list)
    probs: dict[str, list[np.ndarray]] = field(default_factory=lambda: {"served": []})
    steps: dict[str, int] = field(default_factory=lambda: {"batch": 0, "stream": 0})


class HourlyWorld(SingleProcess):
    """A world of one trainer whose data appears hour by hour (see the module docstring)."""

    def __init__(
        self,
        job: PrimusJob,
        timeline: Timeline,
        stepper,
        queue: TrainingQueue,
        windows: list[Path],
        capacity: int | None = None,
    ):
        super().__init__(stepper.mode, Path(tempfile.gettempdir()), Path(tempfile.gettempdir()))
        self.job, self.timeline, self.stepper, self.queue, self.windows = job, timeline, stepper, queue, windows
        self.capacity = capacity  # rows the trainer can train per hour (None: whatever has arrived)
        self.trained = 0  # rows trained since the hour began
        self.replay = GrowingReplay()
        self.scores = Scores()
        self.hour = -1
        self.now = 0.0  # the world's clock (epoch seconds): the start of the current hour
        # called (hour, score entry or None) after each hour (``primus eval``'s progress)
        self.on_hour: Callable[[datetime, dict | None], None] | None = None

    def clock(self) -> float:
        return self.now

    def decide(self, inputs: Inputs, wants: Wants) -> Decision:
        decision = super().decide(inputs, wants)
        last = self.hour + 1 >= len(self.timeline.hours)
        if decision.buffer is not None and (last or self.capacity is None or self.trained < self.capacity):
            return decision
        if last:
            return Decision(None, 0, 0, wants.checkpoint, True, False, False)
        self.advance()
        return Decision(None, 0, 0, wants.checkpoint, False, False, False)

    def advance(self) -> None:
        """The next hour: score its stream rows, then release them and batch window ``t - lag``."""
        tl = self.timeline
        self.hour = t = self.hour + 1
        self.trained = 0
        self.now = tl.hours[t].timestamp()
        rows = tl.stream[t]
        scored = rows if not rows.column(COMPLETE).null_count else rows.filter(pc.is_valid(rows.column(COMPLETE)))
        if t >= tl.eval_from and scored.num_rows:
            self.score(tl.hours[t], scored)
        self.replay.extend(rows.drop([COMPLETE]))
        if t - tl.lag_hours >= 0:
            b = t - tl.lag_hours
            stream = self.job.batch_streams[0].name
            self.queue.append(stream, window_id(tl.hours[b]), str(self.windows[b]), tl.batch[b].num_rows)
        if t + 1 >= len(tl.hours):
            self.replay.finish()
        if self.on_hour is not None:
            self.on_hour(tl.hours[t], self.scores.windows[-1] if t >= tl.eval_from and scored.num_rows else None)

    def score(self, hour: datetime, rows: pa.Table) -> None:
        stepper, scores = self.stepper, self.scores
        batch = to_batch(rows, self.job.spec.features)
        served = stepper.predict(batch)
        labels = rows.column(COMPLETE).to_numpy().astype(np.float64)
        entry = {
            "window": window_id(hour),
            "samples": rows.num_rows,
            "auc": auc(labels, served),
            "logloss": logloss(labels, served),
        }
        scores.labels.append(labels)
        scores.probs["served"].append(served)
        if two_towers(stepper.mode):  # each tower alone too (report.json's memory_auc, adapt_auc, reread_auc)
            for tower in Towers._fields:
                probs = stepper.predict(batch, output=tower)
                scores.probs.setdefault(tower, []).append(probs)
                entry[f"{tower}_auc"] = auc(labels, probs)
        scores.windows.append(entry)

    def step(self, stepper, kind: str, batch, global_rows: int) -> StepResult | None:
        result = super().step(stepper, kind, batch, global_rows)
        if result is not None:
            self.scores.steps[kind] += 1
            self.trained += batch.size
        return result

    def save(self, snapshot, stepper) -> None:
        """A backtest keeps no checkpoints."""

    def publish(self, snapshot, consumed: dict[str, dict]) -> None:
        """Nor progress.json."""

    def restore(self):
        return None
