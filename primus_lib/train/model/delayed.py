"""Delayed feedback on the stream side: the real-time label is provisional.

A click reaches the stream's label only if it comes within the stream's label window; the
batch window's label, joined a day later, is complete. With ``c`` the share of clicks the
real-time label sees (missed independently of the features: the simple model),
``P(y_rt = 1 | x) = c * P(y = 1 | x)``. Every mode's stream steps use ``spec.model.stream_correction``:

- ``likelihood`` (the default): a tower outputs ``p = P(y = 1 | x)``, the complete-label
  probability that is served; its stream loss is the likelihood of the *observed* label under the
  delay model, ``BCE(c * p, y_rt)``. A real-time negative then costs less, since it may be a click
  still to come. With ``c = 1`` (no click is late) it is plain BCE.
- ``none``: plain BCE on the real-time label (Algorithm 1 as written).

MTRM's adapt tower is the exception under ``likelihood``: it fits the real-time label itself (plain
BCE, so a negative teaches it at full strength, as it does online, where tastes turn) and its output
``q`` is read as the complete-label probability ``p = q / c`` (``complete_logit``): the same delay
model, the other side of it.

``c`` comes from the labels the trainer sees anyway (``Completeness``): running click rates of
the stream's and the batch's minibatches, ``c = stream rate / batch rate``. No column beyond
the label is needed, so any spec can use it. Until both kinds were seen (a fresh job's first day:
the first batch window comes a day after its stream) a mode that will see complete labels uses
``UNINFORMED``: the likelihood of a label is linear in ``c``, so under a uniform prior on ``c``
its marginal likelihood is its likelihood at the prior's mean, 1/2. (Training that day's stream
uncorrected, ``c = 1``, cost the single tower and MTRM ~0.002 AUC where 40% of clicks are late; where
the stream sees every click, the prior is wrong that day and cost MTRM up to 0.003 in two worlds:
docs/training.md.) A mode that never sees complete labels (online) has no evidence to come: its
``c`` stays 1, plain BCE, unless it is given (``primus eval``'s ``c=`` variant).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

UNINFORMED = 0.5  # c before any evidence, in a mode that will see complete labels: a uniform prior's mean


class Completeness:
    """``c``: the share of clicks the real-time label sees, from exponentially weighted click
    rates of each kind (``halflife_rows`` rows); ``before`` until both kinds were seen."""

    def __init__(
        self, halflife_rows: float = 50_000.0, floor: float = 0.05, fixed: float | None = None, before: float = 1.0
    ):
        self.fixed = fixed  # a known share (a backtest's oracle for modes that never see complete labels)
        self.before = before  # UNINFORMED where complete labels will come; 1 (plain BCE) where none will
        self.decay = 0.5 ** (1.0 / halflife_rows)
        self.floor = floor
        self.clicks = {"batch": 0.0, "stream": 0.0}
        self.rows = {"batch": 0.0, "stream": 0.0}

    def update(self, kind: str, labels: torch.Tensor) -> None:
        self.add(kind, float(labels.sum()), int(labels.numel()))

    def add(self, kind: str, clicks: float, n: int) -> None:
        """``clicks`` of ``n`` rows of one minibatch (data-parallel: summed over the ranks first)."""
        if not n:
            return
        keep = self.decay**n
        # discounted sums (older minibatches weigh less), alike for both: the ratio is a click rate
        self.clicks[kind] = self.clicks[kind] * keep + clicks
        self.rows[kind] = self.rows[kind] * keep + n

    def rate(self, kind: str) -> float | None:
        return self.clicks[kind] / self.rows[kind] if self.rows[kind] > 0 else None

    @property
    def value(self) -> float:
        if self.fixed is not None:
            return self.fixed
        stream, batch = self.rate("stream"), self.rate("batch")
        if stream is None or not batch:
            return self.before
        return min(1.0, max(self.floor, stream / batch))

    def state_dict(self) -> dict:
        return {"clicks": dict(self.clicks), "rows": dict(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        self.clicks, self.rows = dict(state["clicks"]), dict(state["rows"])


def likelihood_loss(logit: torch.Tensor, labels: torch.Tensor, c: float) -> torch.Tensor:
    """Per-row ``-log P(y_rt | x)`` with ``P(y_rt = 1 | x) = c * sigmoid(logit)``, stable in logits:
    ``log(c p) = log c - softplus(-l)``, ``log(1 - c p) = softplus(l + log(1 - c)) - softplus(l)``."""
    c = min(max(c, 1e-6), 1.0)
    log_pos = math.log(c) - F.softplus(-logit)
    if c >= 1.0:
        log_neg = -F.softplus(logit)
    else:
        log_neg = F.softplus(logit + math.log1p(-c)) - F.softplus(logit)
    return -(labels * log_pos + (1 - labels) * log_neg)


def stream_loss(correction: str, logit: torch.Tensor, labels: torch.Tensor, c: float) -> torch.Tensor:
    """Per-row loss of a stream minibatch on a tower's ``logit`` (see the module docstring)."""
    if correction == "likelihood":
        return likelihood_loss(logit, labels, c)
    if correction == "none":
        return F.binary_cross_entropy_with_logits(logit, labels, reduction="none")
    raise ValueError(f"stream_correction: expected likelihood or none, got {correction!r}")


def complete_logit(logit: torch.Tensor, c: float) -> torch.Tensor:
    """The logit of ``p = q / c`` (capped below 1) for a tower that fits the real-time label: ``q = sigmoid(logit)``."""
    if c >= 1.0:
        return logit
    p = (torch.sigmoid(logit) / max(c, 1e-6)).clamp(1e-7, 1.0 - 1e-6)
    return torch.log(p) - torch.log1p(-p)
