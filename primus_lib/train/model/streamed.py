"""The stream rows' real-time labels, kept until their batch copies arrive: each impression trains once.

A mode that reads both kinds sees most impressions twice: on the stream (fresh, its label missing
the late clicks) and in the batch window a day later (the complete label). Training the batch copy
in full trains the impression twice: a second epoch, a day stale. Measured on the development
worlds, that cost the single tower 0.02 AUC where categories flip and where sparse features are
many (docs/training.md). So the batch copy of a streamed row trains only what its stream step
lacked: its loss is the complete label's BCE minus the stream loss the row already trained
(``delayed.stream_loss``), so the two steps together train the complete label once. Where the labels
agree (and no click is late, ``c = 1``) the copy's gradient is zero; a late click's copy turns the
stream's negative into a positive. A batch row the stream never carried trains in full.

Bounded: past ``CAPACITY`` ids the oldest are dropped (their batch copies then train in full).
Checkpointed with the stepper's evidence, so a restart keeps the rule. In a data-parallel world a
rank knows the stream rows it trained; a batch copy whose stream copy another rank trained trains
in full there (docs/training.md says so).
"""

from __future__ import annotations

import math
from itertools import islice

import torch

CAPACITY = 1_000_000


class StreamedLabels:
    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.labels: dict[str, float] = {}  # id -> the real-time label its stream step trained

    def record(self, ids: list[str], labels: torch.Tensor) -> None:
        """A stream minibatch's rows, as its step trains them."""
        self.labels.update(zip(ids, labels.tolist(), strict=True))
        if len(self.labels) > self.capacity:  # the oldest go: their batch copies train in full
            for key in list(islice(self.labels, len(self.labels) - self.capacity)):
                del self.labels[key]

    def take(self, ids: list[str]) -> torch.Tensor | None:
        """The real-time labels of a batch minibatch's rows (NaN: never streamed), forgotten once taken;
        None when no row was streamed."""
        pop = self.labels.pop
        got = [pop(i, math.nan) for i in ids]
        out = torch.tensor(got, dtype=torch.float32)
        return out if not bool(torch.isnan(out).all()) else None

    def state_dict(self) -> dict:
        return {"ids": list(self.labels), "labels": list(self.labels.values())}

    def load_state_dict(self, state: dict) -> None:
        self.labels = dict(zip(state["ids"], state["labels"], strict=True))
