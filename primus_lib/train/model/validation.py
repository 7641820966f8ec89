"""Progressive validation against complete labels, inside the trainer: which of MTRM's outputs wins.

The stream's real-time label misses late clicks, so scoring the towers on it favours the tower
trained on it. The complete label of a stream row arrives with its batch copy, ``lag`` later. So an
MTRM stream step keeps both towers' logits of its rows (predicted before the step: out of sample)
with the rows' record (``streamed.py``, keyed by the sample id), and the batch step that brings a
row's complete label scores them, as ``primus eval`` scores a run. Three experts: the memory
tower, the adapt tower and the mean of their logits. Their log losses are summed with an exponential discount (``HALFLIFE_ROWS`` scored rows) and
the weights are ``exp(-L_k)`` normalised (the Bayesian mixture: its cumulative loss is within
``log 3`` of the best expert's). The served output is ``sum_k w_k p_k``. Before any row is scored
the prior favours the mean.

Rows past the record's capacity go unscored. The logits are not checkpointed: after a restart the
scoring resumes with the rows of the new process. A data-parallel world sums each step's losses over
ranks.
"""

from __future__ import annotations

import math

import numpy as np
import torch

EXPERTS = ("memory", "adapt", "mean")
PRIOR = {"memory": 3.0, "adapt": 3.0, "mean": 0.0}  # nats: before any evidence, serve the mean
HALFLIFE_ROWS = 5_000.0


def _log_loss(logit: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, logit) - labels * logit  # -log sigmoid(l) if y else -log(1 - sigmoid(l))


class DelayedValidation:
    def __init__(self, halflife_rows: float = HALFLIFE_ROWS):
        self.decay = 0.5 ** (1.0 / halflife_rows)
        self.loss = dict(PRIOR)
        self.scored = 0.0

    @staticmethod
    def score(memory: np.ndarray, adapt: np.ndarray, labels: np.ndarray) -> list[float]:
        """The losses of rows' kept logits against their complete labels: ``[memory, adapt, mean, rows]``."""
        if not len(labels):
            return [0.0, 0.0, 0.0, 0.0]
        y = labels.astype(np.float64)
        losses = [_log_loss(memory, y).sum(), _log_loss(adapt, y).sum(), _log_loss((memory + adapt) / 2, y).sum()]
        return [*map(float, losses), float(len(y))]

    def add(self, increments: list[float]) -> None:
        """Fold in a step's losses (summed over ranks in a data-parallel world)."""
        rows = increments[3]
        if not rows:
            return
        keep = self.decay**rows
        for name, value in zip(EXPERTS, increments[:3], strict=True):
            self.loss[name] = self.loss[name] * keep + value
        self.scored += rows

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
        return {"loss": dict(self.loss), "scored": self.scored}

    def load_state_dict(self, state: dict) -> None:
        self.loss, self.scored = dict(state["loss"]), float(state["scored"])  # older states' "every" is unused
