"""Progressive validation against complete labels, inside the trainer: which of MTRM's outputs wins.

The stream's real-time label misses late clicks, so scoring the towers on it favours the tower
trained on it. The complete label of a stream row arrives with its batch copy, ``lag`` later. So an
MTRM stream step keeps both towers' logits of its rows (predicted before the step: out of sample)
with the rows' record (``streamed.py``, keyed by the sample id), and the batch step that brings a
row's complete label scores them, as ``primus eval`` scores a run. Three experts: the memory
tower, the adapt tower and the mean of their logits. Their log losses are summed with an
exponential discount (``HALFLIFE_ROWS`` scored rows) and the weights are ``exp(-L_k)`` normalised
(the Bayesian mixture: its cumulative loss is within ``log 3`` of the best expert's). The served
output is ``sum_k w_k p_k``. Before any row is scored the prior favours the mean.

Complete labels come a day late, and a day is long where tastes flip. So each stream step's logits
are also scored at once on the rows' real-time labels through the delay model (``P(y_rt = 1) =
c * p``). Those scores flatter an expert that fits the real-time label (the adapt tower: where some
rows' clicks come later than others', ``q / c`` fits them better than the complete probability
does), so each expert's real-time loss is centred on its usual gap to its complete loss, measured
on the rows that have both: what is left is the news, and it counts beside the complete scores.

Rows past the record's capacity go unscored. The logits are not checkpointed: after a restart the
scoring resumes with the rows of the new process. A data-parallel world sums each step's losses over
ranks.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from primus_lib.train.model import delayed

EXPERTS = ("memory", "adapt", "mean")
PRIOR = {"memory": 3.0, "adapt": 3.0, "mean": 0.0}  # nats: before any evidence, serve the mean
HALFLIFE_ROWS = 5_000.0
NONE = [0.0, 0.0, 0.0, 0.0]  # no rows scored


def _log_loss(logit: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, logit) - labels * logit  # -log sigmoid(l) if y else -log(1 - sigmoid(l))


class DelayedValidation:
    def __init__(self, halflife_rows: float = HALFLIFE_ROWS):
        self.decay = 0.5 ** (1.0 / halflife_rows)
        self.loss = dict(PRIOR)
        self.scored = 0.0
        self.gap = [0.0, 0.0, 0.0]  # per expert: discounted sum over rows of real-time minus complete loss
        self.gap_rows = 0.0

    @staticmethod
    def experts(memory: np.ndarray, adapt: np.ndarray) -> list[np.ndarray]:
        """The experts' logits of rows whose towers' logits are ``memory`` and ``adapt``."""
        memory, adapt = memory.astype(np.float64), adapt.astype(np.float64)
        return [memory, adapt, (memory + adapt) / 2]

    @staticmethod
    def score(memory: np.ndarray, adapt: np.ndarray, labels: np.ndarray) -> list[float]:
        """The losses of rows' kept logits against their complete labels: ``[memory, adapt, mean, rows]``."""
        if not len(labels):
            return list(NONE)
        y = labels.astype(np.float64)
        losses = [float(_log_loss(logit, y).sum()) for logit in DelayedValidation.experts(memory, adapt)]
        return [*losses, float(len(y))]

    @staticmethod
    def score_realtime(memory: np.ndarray, adapt: np.ndarray, labels: np.ndarray, c: float) -> list[float]:
        """The losses of a stream step's logits (before the step) against the rows' real-time labels
        through the delay model, ``P(y_rt = 1) = c * p`` (``delayed.likelihood_loss``): ``[memory,
        adapt, mean, rows]``."""
        if not len(labels):
            return list(NONE)
        y = torch.from_numpy(labels.astype(np.float64))
        losses = [
            float(delayed.likelihood_loss(torch.from_numpy(logit), y, c).sum())
            for logit in DelayedValidation.experts(memory, adapt)
        ]
        return [*losses, float(len(y))]

    @staticmethod
    def score_gap(realtime: list[float], complete: list[float]) -> list[float]:
        """The same rows' real-time minus complete scores: how much each expert's real-time score flatters it."""
        return [r - k for r, k in zip(realtime[:3], complete[:3], strict=True)] + [complete[3]]

    def add(self, complete: list[float], gap: list[float] = NONE, realtime: list[float] = NONE) -> None:
        """Fold in a step's scores (summed over ranks in a data-parallel world), each ``[memory, adapt,
        mean, rows]``: ``complete`` (``score``), ``gap`` (``score_gap``) and ``realtime``
        (``score_realtime``)."""
        if gap[3]:
            keep = self.decay ** gap[3]
            self.gap = [g * keep + v for g, v in zip(self.gap, gap[:3], strict=True)]
            self.gap_rows = self.gap_rows * keep + gap[3]
        if realtime[3] and self.gap_rows:  # centred on each expert's usual gap: no bias left but the news
            offsets = [g / self.gap_rows for g in self.gap]
            realtime = [r - realtime[3] * o for r, o in zip(realtime[:3], offsets, strict=True)] + [realtime[3]]
        else:
            realtime = NONE
        rows = complete[3] + realtime[3]
        if rows:
            keep = self.decay**rows
            for i, name in enumerate(EXPERTS):
                self.loss[name] = self.loss[name] * keep + complete[i] + realtime[i]
            self.scored += complete[3]

    def weights(self) -> dict[str, float]:
        low = min(self.loss.values())
        raw = {k: math.exp(low - v) for k, v in self.loss.items()}
        total = sum(raw.values())
        return {k: v / total for k, v in raw.items()}

    def mixture(self, memory_logit: torch.Tensor, adapt_logit: torch.Tensor) -> torch.Tensor:
        """The served probability ``sum_k w_k p_k``."""
        w = self.weights()
        mean = (memory_logit + adapt_logit) / 2
        return (
            w["memory"] * torch.sigmoid(memory_logit)
            + w["adapt"] * torch.sigmoid(adapt_logit)
            + w["mean"] * torch.sigmoid(mean)
        )

    def state_dict(self) -> dict:
        return {"loss": dict(self.loss), "scored": self.scored, "gap": list(self.gap), "gap_rows": self.gap_rows}

    def load_state_dict(self, state: dict) -> None:
        self.loss, self.scored = dict(state["loss"]), float(state["scored"])  # older states' "every" is unused
        self.gap, self.gap_rows = list(state.get("gap", [0.0] * 3)), float(state.get("gap_rows", 0.0))
