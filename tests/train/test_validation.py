"""MTRM's delayed validation: stream rows' logits scored when their complete labels arrive."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from primus_lib.train.model.validation import PRIOR, DelayedValidation


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
