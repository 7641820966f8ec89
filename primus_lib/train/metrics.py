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


class WindowStats:
    """Counts of positives/negatives per probability bin plus the logloss sum."""

    def __init__(self) -> None:
        self.pos = np.zeros(BINS, dtype=np.int64)
        self.neg = np.zeros(BINS, dtype=np.int64)
        self.loss_sum = 0.0
        self.samples = 0

    def add(self, labels: np.ndarray, probs: np.ndarray) -> None:
        y = np.asarray(labels) > 0.5
        p = np.clip(np.asarray(probs, dtype=np.float64), EPS, 1 - EPS)
        bins = np.minimum((p * BINS).astype(np.int64), BINS - 1)
        self.pos += np.bincount(bins[y], minlength=BINS)
        self.neg += np.bincount(bins[~y], minlength=BINS)
        self.loss_sum += float(-(np.where(y, np.log(p), np.log(1 - p))).sum())
        self.samples += int(y.size)

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
