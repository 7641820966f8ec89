"""Progressive validation against complete labels, inside the trainer: which of MTRM's outputs wins.

The stream's real-time label misses late clicks, so scoring the towers on it favours the tower
trained on it. The complete label of a stream row arrives with its batch copy, ``lag`` later. So an
MTRM stream step keeps its towers' logits of its rows (predicted before the step: out of sample)
with the rows' record (``streamed.py``, keyed by the sample id), and the batch step that brings a
row's complete label scores them, as ``primus eval`` scores a run. The experts are blends of the
towers' logits, ``(1 - a) * base + a * adapt`` with ``base`` the memory tower (``a`` in 0, 1/4, 1/2,
3/4, 1) or the reread tower (``a`` in 0 .. 3/4): ``BLENDS``. An expert's loss on a minibatch is its rows times
the share of its (click, no click) pairs it ranks the wrong way round, ``1 - AUC``: the product is
judged by AUC, and the log loss rewards calibration where ranking decides (in flip worlds it served
the towers' mean while the adapt tower ranked better). The losses are summed with an exponential
discount (``HALFLIFE_ROWS`` scored rows) and the weights are ``exp(-L_k)`` normalised, which
concentrates on the blend that ranked best of late. The served output is ``sum_k w_k p_k``.
Before any row is scored the prior favours the mean.

Complete labels come a day late, and a day is long where tastes flip. So each stream step's logits
are also scored at once on the rows' real-time labels. Those scores flatter an expert that fits
the real-time label (the adapt tower: where some rows' clicks come later than others', it ranks
them by their real-time label), so each expert's real-time loss is centred on its usual gap to its
complete loss, measured on the rows that have both: what is left is the news, and it counts beside
the complete scores.

Rows past the record's capacity go unscored. The logits are not checkpointed: after a restart the
scoring resumes with the rows of the new process. A data-parallel world sums each step's losses over
ranks.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

# each expert: (its base tower, a: the adapt tower's share); the memory tower first (``experts``)
BLENDS = {
    "memory": ("memory", 0.0),
    "blend-0.25": ("memory", 0.25),
    "mean": ("memory", 0.5),
    "blend-0.75": ("memory", 0.75),
    "adapt": ("memory", 1.0),
    "reread": ("reread", 0.0),
    "reread-0.25": ("reread", 0.25),
    "reread-mean": ("reread", 0.5),
    "reread-0.75": ("reread", 0.75),
}
EXPERTS = tuple(BLENDS)
K = len(EXPERTS)
_SHARE = np.array([a for _, a in BLENDS.values()])
_ON_REREAD = np.array([base == "reread" for base, _ in BLENDS.values()])


class Towers(NamedTuple):
    """MTRM's three logits of the same rows: numpy arrays, or tensors."""

    memory: Any
    adapt: Any
    reread: Any


PRIOR = {name: 0.0 if name == "mean" else 3.0 for name in EXPERTS}  # before any evidence, serve the mean
HALFLIFE_ROWS = 5_000.0
NONE = [0.0] * (K + 1)  # no rows scored: each expert's loss, then the rows


class Ranking:
    """Each expert's rows in order of its logits (a row of ``logits``: experts x rows) and their 1-based
    ranks along that order, ties at their mean rank: one sort, scored against any labels of the rows."""

    def __init__(self, logits: np.ndarray):
        logits = np.atleast_2d(logits)
        self.order = np.argsort(logits, axis=1)
        ranked = np.take_along_axis(logits, self.order, axis=1)
        n = logits.shape[1]
        starts = np.ones(ranked.shape, bool)  # where a run of equal logits starts
        np.not_equal(ranked[:, 1:], ranked[:, :-1], out=starts[:, 1:])
        if starts.all():
            self.ranks = np.broadcast_to(np.arange(1.0, n + 1), logits.shape)
            return
        # ties, for every expert at once (a loop over experts was 5% of MTRM's step): each position's run's
        # first and last positions, and their mean rank
        position = np.arange(n)
        first = np.maximum.accumulate(np.where(starts, position, 0), axis=1)
        ends = np.ones(ranked.shape, bool)
        ends[:, :-1] = starts[:, 1:]
        last = np.minimum.accumulate(np.where(ends, position, n - 1)[:, ::-1], axis=1)[:, ::-1]
        self.ranks = (first + last) / 2.0 + 1.0

    def misranked(self, labels: np.ndarray) -> np.ndarray:
        """Per expert, the rows times the share of (click, no click) pairs it ranks the wrong way round,
        ties counting half: ``rows * (1 - AUC)``; 0 where the rows are all of one label (no pair to rank)."""
        clicked = labels > 0.5
        clicks, rows = int(clicked.sum()), len(labels)
        pairs = clicks * (rows - clicks)
        if not pairs:
            return np.zeros(len(self.order))
        click_ranks = (self.ranks * clicked[self.order]).sum(axis=1)
        return rows * (1.0 - (click_ranks - clicks * (clicks + 1) / 2.0) / pairs)


def misranked(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``Ranking(logits).misranked(labels)``: each expert's ``rows * (1 - AUC)`` on one set of labels."""
    return Ranking(logits).misranked(labels)


class DelayedValidation:
    def __init__(self, halflife_rows: float = HALFLIFE_ROWS):
        self.decay = 0.5 ** (1.0 / halflife_rows)
        self.loss = dict(PRIOR)
        self.scored = 0.0
        self.gap = [0.0] * K  # per expert: discounted sum over rows of real-time minus complete loss
        self.gap_rows = 0.0

    @staticmethod
    def experts(towers: Towers) -> np.ndarray:
        """The experts' logits (experts x rows) of rows whose towers' logits are ``towers``."""
        return _blends(*(np.asarray(t, np.float64) for t in towers), xp=np)

    @staticmethod
    def score(towers: Towers, labels: np.ndarray) -> list[float]:
        """The losses of rows' logits against their labels (complete, or real-time for a stream step's
        scores at once): each expert's ``misranked``, then the rows."""
        return DelayedValidation.scores(towers, labels)[0]

    @staticmethod
    def scores(towers: Towers, *label_sets: np.ndarray) -> list[list[float]]:
        """``score`` against each set of labels of the same rows (a batch copy's complete and real-time
        labels), the experts' logits sorted once."""
        if not len(towers.memory):
            return [list(NONE) for _ in label_sets]
        ranking = Ranking(DelayedValidation.experts(towers))
        return [[*map(float, ranking.misranked(labels)), float(len(labels))] for labels in label_sets]

    @staticmethod
    def score_gap(realtime: list[float], complete: list[float]) -> list[float]:
        """The same rows' real-time minus complete scores: how much each expert's real-time score flatters it."""
        return [r - k for r, k in zip(realtime[:K], complete[:K], strict=True)] + [complete[K]]

    def add(self, complete: list[float], gap: list[float] = NONE, realtime: list[float] = NONE) -> None:
        """Fold in a step's scores (summed over ranks in a data-parallel world), each one loss per expert
        and then the rows: ``complete`` (``score`` on complete labels), ``gap`` (``score_gap``) and
        ``realtime`` (``score`` on real-time labels)."""
        if gap[K]:
            keep = self.decay ** gap[K]
            self.gap = [g * keep + v for g, v in zip(self.gap, gap[:K], strict=True)]
            self.gap_rows = self.gap_rows * keep + gap[K]
        if realtime[K] and self.gap_rows:  # centred on each expert's usual gap: no bias left but the news
            offsets = [g / self.gap_rows for g in self.gap]
            realtime = [r - realtime[K] * o for r, o in zip(realtime[:K], offsets, strict=True)] + [realtime[K]]
        else:
            realtime = NONE
        rows = complete[K] + realtime[K]
        if rows:
            keep = self.decay**rows
            for i, name in enumerate(EXPERTS):
                self.loss[name] = self.loss[name] * keep + complete[i] + realtime[i]
            self.scored += complete[K]

    def weights(self) -> dict[str, float]:
        low = min(self.loss.values())
        raw = {k: math.exp(low - v) for k, v in self.loss.items()}
        total = sum(raw.values())
        return {k: v / total for k, v in raw.items()}

    def mixture(self, towers: Towers) -> torch.Tensor:
        """The served probability ``sum_k w_k p_k`` of rows whose towers' logits (tensors) are ``towers``."""
        w = self.weights()
        weights = torch.tensor([w[name] for name in EXPERTS], dtype=towers.memory.dtype, device=towers.memory.device)
        return weights @ torch.sigmoid(_blends(*towers, xp=torch))

    def state_dict(self) -> dict:
        return {"loss": dict(self.loss), "scored": self.scored, "gap": list(self.gap), "gap_rows": self.gap_rows}

    def load_state_dict(self, state: dict) -> None:
        if set(state["loss"]) != set(EXPERTS):  # an earlier Primus scored other experts: start afresh
            return
        self.loss, self.scored = dict(state["loss"]), float(state["scored"])  # older states' "every" is unused
        self.gap, self.gap_rows = list(state.get("gap", [0.0] * K)), float(state.get("gap_rows", 0.0))


def _blends(memory, adapt, reread, *, xp):
    """``(1 - a) base + a adapt`` per expert (``xp``: numpy or torch), the towers exactly where ``a`` is 0 or 1
    (an infinite logit times 0 is NaN)."""
    base = xp.stack([reread if on else memory for on in _ON_REREAD])
    share = _SHARE[:, None] if xp is np else torch.as_tensor(_SHARE[:, None], dtype=memory.dtype, device=memory.device)
    blends = (1 - share) * base + share * adapt
    for k, a in enumerate(_SHARE):
        if a in (0.0, 1.0):
            blends[k] = base[k] if a == 0.0 else adapt
    return blends
