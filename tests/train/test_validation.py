"""MTRM's delayed validation: stream rows' logits scored when their complete labels arrive."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from primus_lib.train.model.validation import PRIOR, DelayedValidation, _log_loss


def _scored(validation, ids, labels):
    validation.add(validation.score(ids, torch.tensor(labels, dtype=torch.float32)))


def test_the_expert_closest_to_the_complete_labels_gains_the_weight_and_the_tables():
    rng = np.random.default_rng(0)
    validation = DelayedValidation(halflife_rows=1e9)
    assert validation.weights()["mean"] > 0.9 and validation.adapt_share() == 0.0  # the prior: the mean
    for step in range(40):
        ids = [f"s{step}-{i}" for i in range(64)]
        labels = (rng.random(64) < 0.3).astype(np.float32)
        truth = np.where(labels == 1, 2.0, -2.0)  # the adapt tower knows the labels; the memory tower does not
        validation.record(ids, torch.zeros(64), torch.tensor(truth))
        assert validation.pending.keys() >= set(ids)
        _scored(validation, ids, labels)
        assert not validation.pending  # every kept row scored once
    w = validation.weights()
    assert w["adapt"] > 0.99 and validation.adapt_share() > 0.98
    assert validation.scored == 40 * 64


def test_unknown_ids_score_nothing_and_the_memory_tower_keeps_the_tables_when_it_wins():
    validation = DelayedValidation(halflife_rows=1e9)
    assert validation.score(["nobody"], torch.ones(1)) == [0.0, 0.0, 0.0, 0.0]
    labels = np.array([1.0, 0.0] * 32, dtype=np.float32)
    for step in range(20):
        ids = [f"{step}-{i}" for i in range(64)]
        validation.record(ids, torch.tensor(np.where(labels == 1, 3.0, -3.0)), torch.zeros(64))
        _scored(validation, ids, labels)
    assert validation.weights()["memory"] > 0.99 and validation.adapt_share() == 0.0


def test_a_stream_that_outruns_the_capacity_is_sampled():
    validation = DelayedValidation(capacity=100)
    validation.record([f"r{i}" for i in range(150)], torch.zeros(150), torch.zeros(150))
    assert validation.every == 2 and len(validation.pending) <= 100
    assert "r149" in validation.pending and "r0" not in validation.pending  # the oldest went
    validation.record([f"q{i}" for i in range(80)], torch.zeros(80), torch.zeros(80))
    kept = [k for k in validation.pending if k.startswith("q")]
    assert 10 < len(kept) < 70  # one in two (by the id's hash)


def test_state_round_trip():
    validation = DelayedValidation()
    validation.record(["a", "b"], torch.tensor([1.0, -1.0]), torch.tensor([0.0, 0.0]))
    _scored(validation, ["a", "b"], [1.0, 0.0])
    clone = DelayedValidation()
    clone.load_state_dict(validation.state_dict())
    assert clone.weights() == pytest.approx(validation.weights()) and clone.scored == 2
    assert clone.loss != PRIOR


class _RowByRow(DelayedValidation):
    """The validation's record and score as they were written before they ran in C: one row at a time."""

    def record(self, ids, memory_logit, adapt_logit):
        if not ids:
            return
        memory, adapt = memory_logit.numpy(), adapt_logit.numpy()
        for i, key in enumerate(ids):
            if self.every == 1 or hash(key) % self.every == 0:
                self.pending[key] = (float(memory[i]), float(adapt[i]))
        if len(self.pending) > self.capacity:
            self.every *= 2
            for key in list(self.pending)[: len(self.pending) - self.capacity // 2]:
                del self.pending[key]

    def score(self, ids, labels):
        if not ids or not self.pending:
            return [0.0, 0.0, 0.0, 0.0]
        found, logits = [], []
        for i, key in enumerate(ids):
            got = self.pending.pop(key, None)
            if got is not None:
                found.append(i)
                logits.append(got)
        if not found:
            return [0.0, 0.0, 0.0, 0.0]
        y = labels.numpy()[found].astype(np.float64)
        memory, adapt = np.asarray(logits, dtype=np.float64).T
        losses = [_log_loss(memory, y).sum(), _log_loss(adapt, y).sum(), _log_loss((memory + adapt) / 2, y).sum()]
        return [*map(float, losses), float(len(found))]


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the infinite logits
def test_record_and_score_give_exactly_what_the_row_by_row_loops_gave():
    """Vectorised record/score: the same kept ids, the same sampling and eviction, bit-equal losses, on
    repeated ids within and across minibatches, unknown ids, signed zeros and infinite logits."""
    rng = np.random.default_rng(3)
    fast, slow = DelayedValidation(capacity=300), _RowByRow(capacity=300)
    for step in range(60):
        ids = [f"k{v}" for v in rng.integers(0, 900, 96)]  # repeats, and ids never recorded
        if step % 2 == 0:
            memory = torch.tensor(rng.normal(0, 3, 96), dtype=torch.float32)
            adapt = torch.tensor(rng.normal(0, 3, 96), dtype=torch.float32)
            memory[:3] = torch.tensor([-0.0, float("inf"), -float("inf")])
            for v in (fast, slow):
                v.record(ids, memory, adapt)
            assert list(fast.pending) == list(slow.pending) and fast.every == slow.every
        else:
            labels = torch.tensor(rng.integers(0, 2, 96), dtype=torch.float32)
            np.testing.assert_array_equal(fast.score(ids, labels), slow.score(ids, labels))  # NaN: the infinities
    assert fast.every > 1  # the capacity overflowed: the hash sampling ran too
    assert [complex(*p) for p in slow.pending.values()] == list(fast.pending.values())
