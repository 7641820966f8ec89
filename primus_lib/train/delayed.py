"""Delayed feedback on the stream side: the real-time label is provisional.

A click reaches the stream's label only if it comes within the stream's label window; the
batch window's label, joined a day later, is complete. With ``c`` the share of clicks the
real-time label sees (missed independently of the features: the simple model),
``P(y_rt = 1 | x) = c * P(y = 1 | x)``. MTRM's stream steps train the adapt tower, so this is
where the correction goes (``spec.model.stream_correction``):

- ``likelihood``: the adapt tower outputs ``p = P(y = 1 | x)``, the complete-label probability
  that is served; its stream loss is the likelihood of the *observed* label under the delay
  model, ``BCE(c * p, y_rt)``. A real-time negative then costs less, since it may be a click
  still to come.
- ``soft``: a real-time negative is a fake one with probability ``p_M (1 - c) / (1 - c p_M)``
  (``p_M``: the memory tower's estimate, learned on complete labels); it gets that soft target.
- ``none``: plain BCE on the real-time label (Algorithm 1 as written).

``spec.model.soft_after_rows`` delays ``soft`` until the memory tower has learned something
(``correction_now``): a cold start uses ``likelihood`` first.

``c`` comes from the labels the trainer sees anyway (``Completeness``): running click rates of
the stream's and the batch's minibatches, ``c = stream rate / batch rate``. No column beyond
the label is needed, so any spec can use it.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

CORRECTIONS = ("none", "likelihood", "soft")


class Completeness:
    """``c``: the share of clicks the real-time label sees, from exponentially weighted click
    rates of each kind (``halflife_rows`` rows). 1 (no correction) until both kinds were seen."""

    def __init__(self, halflife_rows: float = 50_000.0, floor: float = 0.05, fixed: float | None = None):
        self.fixed = fixed  # a known share (a backtest's oracle for modes that never see complete labels)
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
            return 1.0
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


def soft_targets(labels: torch.Tensor, memory_logit: torch.Tensor, c: float) -> torch.Tensor:
    """Real-time positives stay 1; a negative gets ``P(click | no click yet) = p_M(1-c)/(1-c p_M)``."""
    p = torch.sigmoid(memory_logit.detach())
    fake = p * (1 - c) / (1 - c * p).clamp_min(1e-6)
    return labels + (1 - labels) * fake


def correction_now(correction: str, memory_rows: int, soft_after_rows: int) -> str:
    """``soft`` leans on the memory tower's odds, which a cold start does not have: until the memory
    tower has trained on ``soft_after_rows`` complete-labelled rows, ``likelihood`` (no memory tower
    needed) stands in for it."""
    if correction == "soft" and memory_rows < soft_after_rows:
        return "likelihood"
    return correction


def stream_loss(
    correction: str, logit: torch.Tensor, labels: torch.Tensor, c: float, memory_logit: torch.Tensor | None
) -> torch.Tensor:
    """Per-row loss of a stream minibatch on the adapt tower's ``logit`` (see the module docstring)."""
    if correction == "likelihood":
        return likelihood_loss(logit, labels, c)
    if correction == "soft":
        if memory_logit is None:
            raise ValueError("stream_correction 'soft' needs the memory tower's logit")
        return F.binary_cross_entropy_with_logits(logit, soft_targets(labels, memory_logit, c), reduction="none")
    if correction == "none":
        return F.binary_cross_entropy_with_logits(logit, labels, reduction="none")
    raise ValueError(f"stream_correction: expected one of {CORRECTIONS}, got {correction!r}")
