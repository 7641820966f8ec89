"""The stream rows awaiting their batch copies: each impression trains once, and MTRM's outputs are
scored on the complete labels.

A mode that reads both kinds sees most impressions twice: on the stream (fresh, its label missing
the late clicks) and in the batch window a day later (the complete label). Training the batch copy
in full trains the impression twice: a second epoch, a day stale. Measured on the development
worlds, that cost the single tower up to 0.02 AUC where categories flip and where sparse features
are many (docs/training.md). So the batch copy of a streamed row trains only what its stream step
lacked: its loss is the complete label's BCE minus the stream loss the row already trained
(``delayed.stream_loss``), so the two steps together train the complete label once. Where the labels
agree (and no click is late, ``c = 1``) the copy's gradient is zero; a late click's copy turns the
stream's negative into a positive. A batch row the stream never carried trains in full.

MTRM also keeps its towers' logits of each stream row, predicted before the row's step, for the
delayed validation (``validation.py``) to score when the complete label arrives. Both read the same
record: one id lookup a row (a second lookup cost MTRM about 6% of its step's CPU on bench/train.py).

Bounded: past ``CAPACITY`` rows the oldest are forgotten (their batch copies then train in full and
are not scored). The ids and labels are checkpointed with the stepper's evidence, so a restart keeps
the rule (a data-parallel checkpoint keeps every rank's records, each restored to its rank); the
logits are not (a restored row is not scored). In a data-parallel world each rank records the
stream rows it trained, and a batch step asks every rank about every row (one all-gather of the ids
as bytes, one all-reduce of the answers), since a row's batch copy rarely lands on the rank that
trained its stream copy; a rank scores only its own rows' logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress, islice, repeat
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from primus_lib.train.distributed.group import Group

CAPACITY = 1_000_000
SEPARATOR = "\0"  # ends each id in a gathered minibatch's bytes
ABSENT = -1  # the position of an id never recorded (or taken already)


def _encode(ids: list[str] | None) -> torch.Tensor:
    joined = SEPARATOR.join(ids) + SEPARATOR if ids else ""
    if ids and joined.count(SEPARATOR) != len(ids):
        bad = next(i for i in ids if SEPARATOR in i)
        raise ValueError(f"row id {bad!r} holds a NUL character: ids are kept NUL-separated (features.id)")
    raw = joined.encode()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)


def _decode(raw: torch.Tensor) -> list[str]:
    return bytes(raw.numpy()).decode().split(SEPARATOR)[:-1] if raw.numel() else []


@dataclass
class Found:
    """What a batch minibatch's rows' stream copies left (None where nothing)."""

    labels: torch.Tensor | None  # per row: the real-time label its stream step trained (NaN: never streamed)
    logits: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # (rows, memory, adapt): this rank's scored rows


class StreamedRows:
    """Stream rows by id, each at a position of fixed-size columns (a ring: ``capacity`` rows)."""

    def __init__(self, capacity: int = CAPACITY, logits: bool = False):
        self.capacity = capacity
        self.logits = logits  # whether the rows keep MTRM's two logits
        self.positions: dict[str, int] = {}  # id -> its row's position (``next`` counts every row recorded)
        self.next = 0
        self.columns: dict[str, np.ndarray] = {}  # "label", "memory", "adapt": allocated at the first record
        self.last = np.zeros(0, np.int64)  # the ring slots of the last recorded minibatch

    def _column(self, name: str) -> np.ndarray:
        if name not in self.columns:
            self.columns[name] = np.full(self.capacity, np.nan, np.float32)
        return self.columns[name]

    def record(self, ids: list[str] | None, labels: torch.Tensor | None) -> None:
        """A stream minibatch's rows (this rank's), as its step trains them."""
        self.last = np.zeros(0, np.int64)
        if not ids or labels is None:
            return
        n = len(ids)
        if labels.numel() != n:
            raise ValueError(f"{n} row ids for {labels.numel()} labels")
        self.positions.update(zip(ids, range(self.next, self.next + n), strict=True))  # in C: a loop took 4x longer
        self.last = np.arange(self.next, self.next + n) % self.capacity
        self.next += n
        self._column("label")[self.last] = labels.detach().cpu().numpy()
        if self.logits:  # until record_logits: not scored
            self._column("memory")[self.last] = np.nan
            self._column("adapt")[self.last] = np.nan
        if len(self.positions) > self.capacity:  # the oldest go: their batch copies train in full
            for key in list(islice(self.positions, len(self.positions) - self.capacity)):
                del self.positions[key]

    def record_logits(self, memory_logit: torch.Tensor, adapt_logit: torch.Tensor) -> None:
        """The towers' logits of the rows ``record`` just took (before their step: out of sample)."""
        if not self.logits or not len(self.last):
            return
        self._column("memory")[self.last] = memory_logit.detach().cpu().numpy()
        self._column("adapt")[self.last] = adapt_logit.detach().cpu().numpy()

    def _pop(self, ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ring slots of ``ids`` and whether each was found here; the found are forgotten."""
        got = map(self.positions.pop, ids, repeat(ABSENT))  # in C: a Python loop took 4x longer
        position = np.fromiter(got, dtype=np.int64, count=len(ids))
        found = position >= max(0, self.next - self.capacity)  # an older position's slot was written over
        return position % self.capacity, found

    def _labels(self, slots: np.ndarray, found: np.ndarray) -> torch.Tensor:
        out = np.full(len(slots), np.nan, np.float32)
        if found.any():
            out[found] = self.columns["label"][slots[found]]
        return torch.from_numpy(out)

    def take(self, ids: list[str] | None, group: Group | None = None) -> Found:
        """What the stream copies of a batch minibatch's rows left. In a data-parallel world (``group``
        active) every rank calls it at every batch step: the labels are found on any rank."""
        mine = ids or []
        if group is None or not group.active:
            slots, found = self._pop(mine)
            labels = self._labels(slots, found)
        else:
            every = [_decode(raw) for raw in group.all_gather(_encode(mine))]
            if not any(every):
                return Found(None, None)
            popped = [self._pop(i) for i in every]
            # label + 1 where this rank trained the row, else 0 (a row streamed twice: the larger label)
            answers = torch.cat([self._labels(*p) for p in popped]).add_(1.0).nan_to_num_(0.0)
            group.max_tensor(answers)
            start = sum(map(len, every[: group.rank]))
            labels = answers[start : start + len(mine)] - 1.0
            labels[labels < 0] = float("nan")
            slots, found = popped[group.rank]
        any_label = bool(mine) and not bool(torch.isnan(labels).all())
        return Found(labels if any_label else None, self._logits(slots, found))

    def _logits(self, slots: np.ndarray, found: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if not self.logits or not found.any():
            return None
        rows = np.flatnonzero(found)
        memory, adapt = self.columns["memory"][slots[rows]], self.columns["adapt"][slots[rows]]
        scored = ~np.isnan(memory)  # recorded with logits (not restored from a checkpoint)
        if not scored.any():
            return None
        return rows[scored], memory[scored].astype(np.float64), adapt[scored].astype(np.float64)

    def _remembered(self) -> tuple[list[str], np.ndarray]:
        """Every remembered row's id and real-time label, oldest first."""
        ids = list(self.positions)
        position = np.fromiter(self.positions.values(), dtype=np.int64, count=len(ids))
        live = position >= max(0, self.next - self.capacity)
        if not live.all():  # rows whose slots were written over: forgotten
            ids, position = list(compress(ids, live)), position[live]
        labels = self.columns["label"][position % self.capacity] if len(ids) else np.zeros(0, np.float32)
        return ids, labels

    def labels_by_id(self) -> dict[str, float]:
        ids, labels = self._remembered()
        return dict(zip(ids, labels.tolist(), strict=True))

    def state_dict(self) -> dict:
        """Two tensors (the ids as bytes, the labels): a checkpoint copies them whole, where lists of a
        million ids would cost the training thread a deepcopy visit per id."""
        ids, labels = self._remembered()
        return {"ids": _encode(ids), "labels": torch.from_numpy(labels.copy())}

    def load_state_dict(self, state: dict, rank: int = 0) -> None:
        """``state`` of one process, or of a data-parallel world's ranks (``{"ranks": [...]}``: ``rank``'s)."""
        if "ranks" in state:
            state = state["ranks"][rank]
        ids, labels = state["ids"], state["labels"]
        if isinstance(ids, torch.Tensor):  # else lists, the first layout
            ids, labels = _decode(ids), labels.tolist()
        if len(ids) != len(labels):
            raise ValueError(f"streamed rows' state: {len(ids)} ids for {len(labels)} labels")
        ids, labels = ids[-self.capacity :], labels[-self.capacity :]
        self.positions, self.next, self.columns = {}, 0, {}
        self.record(ids, torch.tensor(labels, dtype=torch.float32))
