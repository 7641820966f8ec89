"""MTRM's batch_embedding_scale: batch steps' gradient on the shared embeddings is scaled."""

from __future__ import annotations

import pytest
import torch

from primus_lib.spec.training import ModelSpec
from primus_lib.train.steps import Stepper
from tests.train.test_steps import _batch


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def _same(before, module):
    after = module.state_dict()
    return all(torch.equal(before[k], after[k]) for k in before)


def test_batch_embedding_scale_keeps_the_loss_and_zero_freezes_the_tables(tiny):
    _, job = tiny
    batch = _batch(job)
    full, scaled, frozen = (Stepper(job, mode="mtrm", batch_embedding_scale=s) for s in (1.0, 0.3, 0.0))
    tables = _state(frozen.model.embeddings)
    losses = [s.step("batch", batch).loss for s in (full, scaled, frozen)]
    assert losses[0] == losses[1] == losses[2], "the scale changes the gradient, never the forward value"
    assert _same(tables, frozen.model.embeddings)
    assert not _same(tables, scaled.model.embeddings)


def test_batch_embedding_scale_is_mtrms_spec_option(tiny):
    _, job = tiny
    assert job.spec.model.batch_embedding_scale == 0.5  # the default (docs/training.md)
    assert Stepper(job, mode="mtrm").batch_emb_scale == 0.5
    assert Stepper(job, mode="single_tower").batch_emb_scale == 1.0  # the baselines train as before
    with pytest.raises(ValueError, match="batch_embedding_scale"):
        ModelSpec(memory_tower=[4], adapt_tower=[4], batch_embedding_scale=1.5)
