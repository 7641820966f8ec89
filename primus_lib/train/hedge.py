"""The served output that follows the better of MTRM's predictors, from progressive validation.

Each stream minibatch is scored by every expert before any tower trains on it (so every score is
out of sample): the adapt tower, the memory tower and their mean in logits. An expert's loss is
the log-likelihood of the observed real-time label under the delay model, ``P(y_rt = 1) = c p``
(``delayed.likelihood_loss``), so a late click the stream never saw does not count against an
expert that predicted it. Losses are summed with an exponential discount (``halflife_rows``), and
the served probability is the mixture ``sum_k w_k p_k`` with ``w_k ~ exp(-eta L_k)``: with
``eta = 1`` and log loss this is the Bayesian mixture, whose cumulative loss is within ``log K`` of
the best expert's; the discount lets it follow a world in which the best expert changes.
"""

from __future__ import annotations

import math

import torch

from primus_lib.train import delayed

EXPERTS = ("adapt", "memory", "mean")


class Hedge:
    def __init__(self, halflife_rows: float = 100_000.0, eta: float = 1.0):
        self.decay = 0.5 ** (1.0 / halflife_rows)
        self.eta = eta
        self.loss = {k: 0.0 for k in EXPERTS}

    @staticmethod
    def logits(adapt: torch.Tensor, memory: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"adapt": adapt, "memory": memory, "mean": (adapt + memory) / 2}

    def observe(self, adapt: torch.Tensor, memory: torch.Tensor, labels: torch.Tensor, c: float) -> None:
        """Score a stream minibatch's rows (before the step) and discount the older losses."""
        keep = self.decay ** int(labels.numel())
        for name, logit in self.logits(adapt.detach(), memory.detach()).items():
            self.loss[name] = self.loss[name] * keep + float(delayed.likelihood_loss(logit, labels, c).sum())

    def weights(self) -> dict[str, float]:
        low = min(self.loss.values())
        raw = {k: math.exp(-self.eta * (v - low)) for k, v in self.loss.items()}
        total = sum(raw.values())
        return {k: v / total for k, v in raw.items()}

    def predict(self, adapt: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """The served probability."""
        weights = self.weights()
        logits = self.logits(adapt, memory)
        return sum(w * torch.sigmoid(logits[k]) for k, w in weights.items())

    def state_dict(self) -> dict:
        return {"loss": dict(self.loss)}

    def load_state_dict(self, state: dict) -> None:
        self.loss = dict(state["loss"])
