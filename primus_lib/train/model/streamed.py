"""The stream rows' real-time labels, kept until their batch copies arrive: each impression trains once.

A mode that reads both kinds sees most impressions twice: on the stream (fresh, its label missing
the late clicks) and in the batch window a day later (the complete label). Training the batch copy
in full trains the impression twice: a second epoch, a day stale. Measured on the development
worlds, that cost the single tower up to 0.02 AUC where categories flip and where sparse features
are many (docs/training.md). So the batch copy of a streamed row trains only what its stream step
lacked: its loss is the complete label's BCE minus the stream loss the row already trained
(``delayed.stream_loss``), so the two steps together train the complete label once. Where the labels
agree (and no click is late, ``c = 1``) the copy's gradient is zero; a late click's copy turns the
stream's negative into a positive. A batch row the stream never carried trains in full.

Bounded: past ``CAPACITY`` ids the oldest are dropped (their batch copies then train in full).
Checkpointed with the stepper's evidence, so a restart keeps the rule (a data-parallel checkpoint
keeps every rank's records, each restored to its rank). In a data-parallel world each
rank records the stream rows it trained, and a batch step asks every rank about every row (one
all-gather of the ids as bytes, one all-reduce of the answers), since a row's batch copy rarely
lands on the rank that trained its stream copy.
"""

from __future__ import annotations

from itertools import islice, repeat
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from primus_lib.train.distributed.group import Group

CAPACITY = 1_000_000
SEPARATOR = "\0"  # ends each id in a gathered minibatch's bytes


def _encode(ids: list[str] | None) -> torch.Tensor:
    joined = SEPARATOR.join(ids) + SEPARATOR if ids else ""
    if ids and joined.count(SEPARATOR) != len(ids):
        bad = next(i for i in ids if SEPARATOR in i)
        raise ValueError(f"row id {bad!r} holds a NUL character: ids are kept NUL-separated (features.id)")
    raw = joined.encode()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)


def _decode(raw: torch.Tensor) -> list[str]:
    return bytes(raw.numpy()).decode().split(SEPARATOR)[:-1] if raw.numel() else []


class StreamedLabels:
    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.labels: dict[str, float] = {}  # id -> the real-time label its stream step trained

    def record(self, ids: list[str] | None, labels: torch.Tensor | None) -> None:
        """A stream minibatch's rows (this rank's), as its step trains them."""
        if not ids or labels is None:
            return
        self.labels.update(zip(ids, labels.tolist(), strict=True))
        if len(self.labels) > self.capacity:  # the oldest go: their batch copies train in full
            for key in list(islice(self.labels, len(self.labels) - self.capacity)):
                del self.labels[key]

    def _pop(self, ids: list[str]) -> torch.Tensor:
        """The labels of ``ids`` this process recorded (NaN: not here), forgotten once taken."""
        got = map(self.labels.pop, ids, repeat(float("nan")))  # in C: a Python loop took 4x longer
        return torch.from_numpy(np.fromiter(got, dtype=np.float32, count=len(ids)))

    def take(self, ids: list[str] | None, group: Group | None = None) -> torch.Tensor | None:
        """The real-time labels of a batch minibatch's rows (NaN: never streamed); None when no row
        was. In a data-parallel world (``group`` active) every rank calls it at every batch step."""
        mine = ids or []
        if group is None or not group.active:
            found = self._pop(mine)
        else:
            every = [_decode(raw) for raw in group.all_gather(_encode(mine))]
            if not any(every):
                return None
            # label + 1 where this rank trained the row, else 0 (a row streamed twice: the larger label)
            answers = torch.cat([self._pop(i) for i in every]).add_(1.0).nan_to_num_(0.0)
            group.max_tensor(answers)
            start = sum(map(len, every[: group.rank]))
            found = answers[start : start + len(mine)] - 1.0
            found[found < 0] = float("nan")
        return found if mine and not bool(torch.isnan(found).all()) else None

    def state_dict(self) -> dict:
        """Two tensors (the ids as bytes, the labels): a checkpoint copies them whole, where lists of a
        million ids would cost the training thread a deepcopy visit per id."""
        return {"ids": _encode(list(self.labels)), "labels": torch.tensor(list(self.labels.values()))}

    def load_state_dict(self, state: dict, rank: int = 0) -> None:
        """``state`` of one process, or of a data-parallel world's ranks (``{"ranks": [...]}``: ``rank``'s)."""
        if "ranks" in state:
            state = state["ranks"][rank]
        ids, labels = state["ids"], state["labels"]
        if isinstance(ids, torch.Tensor):  # else lists, the first layout
            ids, labels = _decode(ids), labels.tolist()
        self.labels = dict(zip(ids, labels, strict=True))
