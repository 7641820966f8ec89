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

Rows are known by a 64-bit hash of their sample id (pandas' stable siphash: the same on every
host). Bounded: past ``CAPACITY`` ids the oldest are dropped (their batch copies then train in
full). Checkpointed with the stepper's evidence, so a restart keeps the rule. In a data-parallel
world each rank records the stream rows it trained, and a batch step asks every rank about every
row (one all-gather of the hashes, one all-reduce of the answers), since a row's batch copy rarely
lands on the rank that trained its stream copy.
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

import numpy as np
import torch
from pandas.util import hash_array

if TYPE_CHECKING:
    from primus_lib.train.distributed.group import Group

CAPACITY = 1_000_000


def _keys(ids: list[str] | None) -> torch.Tensor:
    if not ids:
        return torch.zeros(0, dtype=torch.int64)
    return torch.from_numpy(hash_array(np.asarray(ids, dtype=object)).view(np.int64))


class StreamedLabels:
    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.labels: dict[int, float] = {}  # id hash -> the real-time label its stream step trained

    def record(self, ids: list[str] | None, labels: torch.Tensor | None) -> None:
        """A stream minibatch's rows (this rank's), as its step trains them."""
        if not ids or labels is None:
            return
        self.labels.update(zip(_keys(ids).tolist(), labels.tolist(), strict=True))
        if len(self.labels) > self.capacity:  # the oldest go: their batch copies train in full
            for key in list(islice(self.labels, len(self.labels) - self.capacity)):
                del self.labels[key]

    def _pop(self, keys: torch.Tensor) -> torch.Tensor:
        """The labels of ``keys`` this process recorded (NaN: not here), forgotten once taken."""
        pop = self.labels.pop
        return torch.tensor([pop(k, float("nan")) for k in keys.tolist()], dtype=torch.float32)

    def take(self, ids: list[str] | None, group: Group | None = None) -> torch.Tensor | None:
        """The real-time labels of a batch minibatch's rows (NaN: never streamed); None when no row
        was. In a data-parallel world (``group`` active) every rank calls it at every batch step."""
        keys = _keys(ids)
        if group is None or not group.active:
            found = self._pop(keys)
        else:
            every = group.all_gather(keys)
            if not sum(k.numel() for k in every):
                return None
            # label + 1 where this rank trained the row, else 0 (a row streamed twice: the larger label)
            answers = torch.cat([self._pop(k) for k in every]).add_(1.0).nan_to_num_(0.0)
            group.max_tensor(answers)
            start = sum(k.numel() for k in every[: group.rank])
            found = answers[start : start + keys.numel()] - 1.0
            found[found < 0] = float("nan")
        return found if keys.numel() and not bool(torch.isnan(found).all()) else None

    def state_dict(self) -> dict:
        return {"keys": list(self.labels), "labels": list(self.labels.values())}

    def load_state_dict(self, state: dict) -> None:
        self.labels = dict(zip(state["keys"], state["labels"], strict=True))
