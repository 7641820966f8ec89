"""MTRM's embedding options: per-tower tables, scaled batch gradients, the fresh-row rule."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from primus_lib.spec.training import ModelSpec
from primus_lib.train.delayed import RowRecency
from primus_lib.train.steps import Stepper
from tests.train.test_steps import _batch


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def _same(before, module):
    after = module.state_dict()
    return all(torch.equal(before[k], after[k]) for k in before)


def test_per_tower_tables_move_with_their_own_steps_only(tiny):
    _, job = tiny
    stepper = Stepper(job, mode="mtrm", embedding_tables="per_tower")
    memory, adapt = _state(stepper.model.embeddings), _state(stepper.model.adapt_embeddings)
    stepper.step("batch", _batch(job, seed=1))
    assert _same(adapt, stepper.model.adapt_embeddings), "a batch step moved the adapt tower's tables"
    assert not _same(memory, stepper.model.embeddings), "a batch step did not move the memory tower's tables"
    memory = _state(stepper.model.embeddings)
    stepper.step("stream", _batch(job, seed=2))
    assert _same(memory, stepper.model.embeddings), "a stream step moved the memory tower's tables"
    assert not _same(adapt, stepper.model.adapt_embeddings), "a stream step did not move the adapt tables"


def test_per_tower_state_round_trip(tiny):
    _, job = tiny
    batch = _batch(job)
    stepper = Stepper(job, mode="mtrm", embedding_tables="per_tower")
    for kind in ("batch", "stream", "batch"):
        stepper.step(kind, batch)
    clone = Stepper(job, mode="mtrm", embedding_tables="per_tower", seed=7)
    buffer = io.BytesIO()
    torch.save(stepper.state_dict(), buffer)
    buffer.seek(0)
    clone.load_state_dict(torch.load(buffer, weights_only=False))
    np.testing.assert_array_equal(clone.predict(batch), stepper.predict(batch))
    assert stepper.step("stream", batch).loss == clone.step("stream", batch).loss  # both tables' Adagrad state


def test_batch_embedding_scale_keeps_the_loss_and_zero_freezes_the_tables(tiny):
    _, job = tiny
    batch = _batch(job)
    full, scaled, frozen = (Stepper(job, mode="mtrm", batch_embedding_scale=s) for s in (1.0, 0.3, 0.0))
    tables = _state(frozen.model.embeddings)
    losses = [s.step("batch", batch).loss for s in (full, scaled, frozen)]
    assert losses[0] == losses[1] == losses[2], "the scale changes the gradient, never the forward value"
    assert _same(tables, frozen.model.embeddings)
    assert not _same(tables, scaled.model.embeddings)


def test_row_recency_marks_rows_the_stream_updated_after_the_impression(tiny):
    _, job = tiny
    recency = RowRecency({f.name: f.buckets for f in job.spec.features.sparse})
    stream = _batch(job, rows=8, seed=3)
    stream.ts[:] = 1_000
    recency.seen(stream.sparse, stream.ts)
    before, after = _batch(job, rows=8, seed=3), _batch(job, rows=8, seed=3)
    before.ts[:], after.ts[:] = 500, 2_000
    assert recency.fresh(before.sparse, before.ts).all()  # same ids, the stream saw them later
    assert not recency.fresh(after.sparse, after.ts).any()  # the stream's update is older than the row
    state = recency.state_dict()
    again = RowRecency({f.name: f.buckets for f in job.spec.features.sparse})
    again.load_state_dict(state)
    assert torch.equal(again.fresh(before.sparse, before.ts), recency.fresh(before.sparse, before.ts))


def test_fresh_rows_get_the_fresh_scale_on_batch_steps(tiny):
    _, job = tiny
    stream, late = _batch(job, seed=4), _batch(job, seed=4)
    stream.ts[:] = 10_000
    late.ts[:] = 0  # impressions older than the stream's update of every one of their ids
    stepper = Stepper(job, mode="mtrm", fresh_row_scale=0.0)
    stepper.step("stream", stream)
    tables = _state(stepper.model.embeddings)
    stepper.step("batch", late)
    assert _same(tables, stepper.model.embeddings), "fresh rows got a batch gradient"
    plain = Stepper(job, mode="mtrm")
    plain.step("stream", stream)
    tables = _state(plain.model.embeddings)
    plain.step("batch", late)
    assert not _same(tables, plain.model.embeddings)


def test_averaged_adapt_tower_serves_the_average_and_trains_the_live_weights(tiny):
    _, job = tiny
    first, second = _batch(job, seed=5), _batch(job, seed=6)
    averaged, plain = Stepper(job, mode="mtrm", adapt_average=0.5), Stepper(job, mode="mtrm")
    for stepper in (averaged, plain):
        stepper.step("stream", first)
    np.testing.assert_array_equal(averaged.predict(second), plain.predict(second))  # the average of one step
    for stepper in (averaged, plain):
        stepper.step("stream", second)
    assert not np.allclose(averaged.predict(second), plain.predict(second))
    assert averaged.step("stream", first).loss == plain.step("stream", first).loss  # live weights unchanged


def test_batch_embedding_scale_is_mtrms_spec_option(tiny):
    _, job = tiny
    assert job.spec.model.batch_embedding_scale == 0.5  # the default (docs/training.md)
    assert Stepper(job, mode="mtrm").batch_emb_scale == 0.5
    assert Stepper(job, mode="single_tower").batch_emb_scale == 1.0  # the baselines train as before
    with pytest.raises(ValueError, match="batch_embedding_scale"):
        ModelSpec(memory_tower=[4], adapt_tower=[4], batch_embedding_scale=1.5)
