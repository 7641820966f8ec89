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

MTRM also keeps its three towers' logits of each stream row, predicted before the row's step, for the
delayed validation (``validation.py``) to score when the complete label arrives. Both read the same
record: one id lookup a row (a second lookup cost MTRM about 6% of its step's CPU on bench/train.py).
The ids arrive as 64-bit keys hashed on the prefetch thread (``row_keys.py``) and are looked up a
minibatch at a time (``key_table.py``), not a Python string a row.

Bounded: past ``CAPACITY`` rows the oldest are forgotten (their batch copies then train in full and
are not scored). The keys and labels are checkpointed with the stepper's evidence, so a restart keeps
the rule (a data-parallel checkpoint keeps every rank's records, each restored to its rank); the
logits are not (a restored row is not scored). In a data-parallel world each rank records the
stream rows it trained, and a batch step asks every rank about every row (one all-gather of the
keys, one all-reduce of the answers), since a row's batch copy rarely lands on the rank that
trained its stream copy; a rank scores only its own rows' logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from primus_lib.train.model.key_table import ABSENT, KeyTable
from primus_lib.train.model.row_keys import NO_KEY, row_keys
from primus_lib.train.model.validation import Towers

if TYPE_CHECKING:
    from primus_lib.train.distributed.group import Group

CAPACITY = 1_000_000


def as_keys(ids: np.ndarray | Sequence[str] | None) -> np.ndarray:
    """A minibatch's row keys: given (uint64), or hashed from its ids."""
    if ids is None:
        return np.zeros(0, np.uint64)
    if isinstance(ids, np.ndarray):
        return ids
    return row_keys(ids)


@dataclass
class Found:
    """What a batch minibatch's rows' stream copies left (None where nothing)."""

    labels: torch.Tensor | None  # per row: the real-time label its stream step trained (NaN: never streamed)
    logits: tuple[np.ndarray, Towers] | None  # (rows, their towers' logits): this rank's scored rows


class StreamedRows:
    """Stream rows by key, each at a position of fixed-size columns (a ring: ``capacity`` rows)."""

    def __init__(self, capacity: int = CAPACITY, logits: bool = False):
        self.capacity = capacity
        self.logits = logits  # whether the rows keep MTRM's towers' logits
        self.table = KeyTable(capacity)  # key -> its row's position (``next`` counts every row recorded)
        self.next = 0
        self.columns: dict[str, np.ndarray] = {}  # "label" and each tower's logit: allocated at the first record
        self.last = np.zeros(0, np.int64)  # the ring slots of the last recorded minibatch

    def _column(self, name: str) -> np.ndarray:
        if name not in self.columns:
            self.columns[name] = np.full(self.capacity, np.nan, np.float32)
        return self.columns[name]

    def record(self, ids: np.ndarray | Sequence[str] | None, labels: torch.Tensor | None) -> None:
        """A stream minibatch's rows (this rank's), as its step trains them: their keys (or ids)."""
        self.last = np.zeros(0, np.int64)
        keys = as_keys(ids)
        if not len(keys) or labels is None:
            return
        n = len(keys)
        if labels.numel() != n:
            raise ValueError(f"{n} row ids for {labels.numel()} labels")
        positions = np.arange(self.next, self.next + n)
        self.last = positions % self.capacity
        self.next += n
        self.table.floor = max(0, self.next - self.capacity)  # older positions' slots are written over
        keyed = keys != NO_KEY  # a row without an id is trained, never found
        self.table.put(keys[keyed], positions[keyed])
        self._column("label")[self.last] = labels.detach().cpu().numpy()
        if self.logits:  # until record_logits: not scored
            for tower in Towers._fields:
                self._column(tower)[self.last] = np.nan

    def record_logits(self, towers: Towers) -> None:
        """The towers' logits (numpy) of the rows ``record`` just took (before their step: out of sample)."""
        if not self.logits or not len(self.last):
            return
        for tower, logits in zip(Towers._fields, towers, strict=True):
            self._column(tower)[self.last] = logits

    def _pop(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ring slots of ``keys`` and whether each was found here; the found are forgotten."""
        position = self.table.pop(keys)
        return position % self.capacity, position != ABSENT

    def _labels(self, slots: np.ndarray, found: np.ndarray) -> torch.Tensor:
        out = np.full(len(slots), np.nan, np.float32)
        if found.any():
            out[found] = self.columns["label"][slots[found]]
        return torch.from_numpy(out)

    def take(self, ids: np.ndarray | Sequence[str] | None, group: Group | None = None) -> Found:
        """What the stream copies of a batch minibatch's rows left. In a data-parallel world (``group``
        active) every rank calls it at every batch step: the labels are found on any rank."""
        mine = as_keys(ids)
        if group is None or not group.active:
            slots, found = self._pop(mine)
            labels = self._labels(slots, found)
        else:
            every = [raw.numpy().view(np.uint64) for raw in group.all_gather(torch.from_numpy(mine.view(np.int64)))]
            if not any(len(k) for k in every):
                return Found(None, None)
            popped = [self._pop(k) for k in every]
            # label + 1 where this rank trained the row, else 0 (a row streamed twice: the larger label)
            answers = torch.cat([self._labels(*p) for p in popped]).add_(1.0).nan_to_num_(0.0)
            group.max_tensor(answers)
            start = sum(map(len, every[: group.rank]))
            labels = answers[start : start + len(mine)] - 1.0
            labels[labels < 0] = float("nan")
            slots, found = popped[group.rank]
        any_label = bool(len(mine)) and not bool(torch.isnan(labels).all())
        return Found(labels if any_label else None, self._logits(slots, found))

    def _logits(self, slots: np.ndarray, found: np.ndarray) -> tuple[np.ndarray, Towers] | None:
        if not self.logits or not found.any():
            return None
        rows = np.flatnonzero(found)
        towers = [self.columns[tower][slots[rows]] for tower in Towers._fields]
        scored = ~np.isnan(towers[0])  # recorded with logits (not restored from a checkpoint)
        if not scored.any():
            return None
        return rows[scored], Towers(*(t[scored].astype(np.float64) for t in towers))

    def _remembered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every remembered row's key, real-time label and position (in no order: a checkpoint
        would pay a sort of up to a million positions; a restore sorts them once)."""
        keys, position = self.table.live()
        labels = self.columns["label"][position % self.capacity] if len(keys) else np.zeros(0, np.float32)
        return keys, labels, position

    def labels_by_key(self) -> dict[int, float]:
        keys, labels, _ = self._remembered()
        return dict(zip(keys.tolist(), labels.tolist(), strict=True))

    def state_dict(self) -> dict:
        """Three tensors (the keys, the labels, their positions): a checkpoint copies them whole."""
        keys, labels, position = self._remembered()
        return {  # each a fresh array (gathered from the table and the columns)
            "keys": torch.from_numpy(keys.view(np.int64)),
            "labels": torch.from_numpy(labels),
            "positions": torch.from_numpy(position),
        }

    def load_state_dict(self, state: dict, rank: int = 0) -> None:
        """``state`` of one process, or of a data-parallel world's ranks (``{"ranks": [...]}``: ``rank``'s).
        Earlier layouts kept the ids themselves (NUL-separated bytes, or a list): they are hashed."""
        if "ranks" in state:
            state = state["ranks"][rank]
        labels = state["labels"]
        labels = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels, np.float32)
        if "keys" in state:
            keys = state["keys"].numpy().view(np.uint64)
        else:
            ids = state["ids"]
            if isinstance(ids, torch.Tensor):
                ids = bytes(ids.numpy()).decode().split("\0")[:-1] if ids.numel() else []
            keys = row_keys(ids)
        positions = state["positions"].numpy() if "positions" in state else np.arange(len(keys))
        if not len(keys) == len(labels) == len(positions):
            raise ValueError(
                f"streamed rows' state: {len(keys)} ids for {len(labels)} labels and {len(positions)} positions"
            )
        order = np.argsort(positions, kind="stable")  # oldest first: again the first forgotten
        keys, labels = keys[order], labels[order]
        keys, labels = keys[-self.capacity :], labels[-self.capacity :]
        self.table, self.next, self.columns = KeyTable(self.capacity), 0, {}
        self.record(keys, torch.tensor(labels, dtype=torch.float32))
