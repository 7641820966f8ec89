"""AUC and logloss: exact for the backtest, binned (mergeable, checkpointable) for the trainer."""

from __future__ import annotations

import numpy as np

EPS = 1e-7
BINS = 1000


def auc(labels: np.ndarray, probs: np.ndarray) -> float | None:
    """Rank-based ROC AUC with tied scores averaged; None when one class is missing."""
    labels = np.asarray(labels) > 0.5
    probs = np.asarray(probs, dtype=np.float64)
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        return None
    order = np.argsort(probs, kind="mergesort")
    sorted_probs = probs[order]
    ranks = np.empty(labels.size, dtype=np.float64)
    _, first, counts = np.unique(sorted_probs, return_index=True, return_counts=True)
    average = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(average, counts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def logloss(labels: np.ndarray, probs: np.ndarray) -> float | None:
    if len(labels) == 0:
        return None
    p = np.clip(np.asarray(probs, dtype=np.float64), EPS, 1 - EPS)
    y = np.asarray(labels, dtype=np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


class _Folded:
    """A count of ``WindowStats`` read or set only after the held minibatches are folded in."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, stats: WindowStats | None, owner: type | None = None):
        if stats is None:
            return self
        stats._fold()
        return getattr(stats, self.slot)

    def __set__(self, stats: WindowStats, value) -> None:
        stats._fold()
        setattr(stats, self.slot, value)


class WindowStats:
    """Counts of positives/negatives per probability bin plus the logloss sum.

    ``add`` runs after every training step: it keeps the minibatch's arrays and folds them into
    the counts ``FOLD_ROWS`` rows at a time (a dozen numpy calls per 512 rows otherwise); every
    reader of the counts folds what is held first."""

    FOLD_ROWS = 8192

    def __init__(self) -> None:
        self._pos = np.zeros(BINS, dtype=np.int64)
        self._neg = np.zeros(BINS, dtype=np.int64)
        self._loss_sum = 0.0
        self._samples = 0
        self._held: list[tuple[np.ndarray, np.ndarray]] = []
        self._held_rows = 0

    def add(self, labels: np.ndarray, probs: np.ndarray) -> None:
        self._held.append((np.asarray(labels), np.asarray(probs)))
        self._held_rows += len(self._held[-1][0])
        if self._held_rows >= self.FOLD_ROWS:
            self._fold()

    def _fold(self) -> None:
        if not self._held:
            return
        held, self._held, self._held_rows = self._held, [], 0
        y = np.concatenate([h[0] for h in held]) > 0.5
        p = np.clip(np.concatenate([h[1] for h in held]).astype(np.float64), EPS, 1 - EPS)
        bins = np.minimum((p * BINS).astype(np.int64), BINS - 1)
        counts = np.bincount(bins + BINS * y, minlength=2 * BINS)  # negatives, then positives: one pass
        self._neg += counts[:BINS]
        self._pos += counts[BINS:]
        self._loss_sum += float(-np.log(np.where(y, p, 1 - p)).sum())
        self._samples += int(y.size)

    pos = _Folded()
    neg = _Folded()
    loss_sum = _Folded()
    samples = _Folded()

    def auc(self) -> float | None:
        pos_total, neg_total = self.pos.sum(), self.neg.sum()
        if pos_total == 0 or neg_total == 0:
            return None
        neg_below = np.cumsum(self.neg) - self.neg
        return float(((self.pos * neg_below).sum() + 0.5 * (self.pos * self.neg).sum()) / (pos_total * neg_total))

    def logloss(self) -> float | None:
        return self.loss_sum / self.samples if self.samples else None

    def merge(self, other: WindowStats) -> None:
        """Add ``other``'s counts (the same window's statistics from another rank)."""
        self.pos += other.pos
        self.neg += other.neg
        self.loss_sum += other.loss_sum
        self.samples += other.samples

    def to_dict(self) -> dict:
        return {"pos": self.pos.tolist(), "neg": self.neg.tolist(), "loss_sum": self.loss_sum, "samples": self.samples}

    @classmethod
    def from_dict(cls, raw: dict) -> WindowStats:
        stats = cls()
        stats.pos = np.array(raw["pos"], dtype=np.int64)
        stats.neg = np.array(raw["neg"], dtype=np.int64)
        stats.loss_sum = float(raw["loss_sum"])
        stats.samples = int(raw["samples"])
        return stats
