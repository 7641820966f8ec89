"""Algorithm 1: each minibatch kind moves exactly the parameters it owns."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_lib.train.batch import to_batch
from primus_lib.train.steps import Stepper


def _batch(job, rows=64, seed=0):
    rng = np.random.default_rng(seed)
    table = pa.table(
        {
            "request_id": [f"r{i}" for i in range(rows)],
            "clicked": rng.integers(0, 2, rows).astype(np.float32),
            "ts": np.arange(rows, dtype=np.int64),
            "user_id": rng.integers(0, 2000, rows),
            "item_id": rng.integers(0, 2000, rows),
            "category": rng.integers(0, 64, rows),
            "price": rng.uniform(1, 50, rows).astype(np.float32),
            "age": rng.uniform(18, 70, rows).astype(np.float32),
        }
    )
    return to_batch(table, job.spec.features, "request_id")


def _snapshot(params):
    return [p.detach().clone() for p in params]


def _equal(before, params):
    return all(torch.equal(a, b.detach()) for a, b in zip(before, params, strict=True))


def _tables(stepper):
    return {k: v.clone() for k, v in stepper.model.embeddings.state_dict().items()}


def test_batch_step_moves_memory_only(tiny):
    _, job = tiny
    stepper = Stepper(job, mode="mtrm")
    adapt, memory = _snapshot(stepper.model.adapt_parameters()), _snapshot(stepper.model.memory_parameters())
    tables = _tables(stepper)
    result = stepper.step("batch", _batch(job))
    assert result.graph == "memory"
    assert _equal(adapt, stepper.model.adapt_parameters()), "a batch step changed the adapt tower"
    assert not _equal(memory, stepper.model.memory_parameters()), "a batch step did not train the memory tower"
    after = _tables(stepper)
    assert any(not torch.equal(tables[k], after[k]) for k in tables), "embedding_updates=both: batch updates tables"


def test_stream_step_moves_adapt_only(tiny):
    _, job = tiny
    stepper = Stepper(job, mode="mtrm")
    stepper.step("batch", _batch(job, seed=1))  # non-trivial memory tower and optimizer state
    adapt, memory = _snapshot(stepper.model.adapt_parameters()), _snapshot(stepper.model.memory_parameters())
    memory_opt = {k: v.clone() for k, v in stepper.optimizers["memory"].state_dict()["state"][0].items()}
    result = stepper.step("stream", _batch(job, seed=2))
    assert result.graph == "adapt"
    assert _equal(memory, stepper.model.memory_parameters()), "a stream step changed the memory tower"
    assert all(torch.equal(memory_opt[k], v) for k, v in stepper.optimizers["memory"].state_dict()["state"][0].items())
    assert not _equal(adapt, stepper.model.adapt_parameters()), "a stream step did not train the adapt tower"


@pytest.mark.parametrize(
    ("updates", "kind", "moves"),
    [("batch", "stream", False), ("stream", "batch", False), ("batch", "batch", True), ("stream", "stream", True)],
)
def test_embedding_updates_follow_spec(tiny, updates, kind, moves):
    _, job = tiny
    stepper = Stepper(job, mode="mtrm", embedding_updates=updates)
    tables = _tables(stepper)
    stepper.step(kind, _batch(job))
    after = _tables(stepper)
    changed = any(not torch.equal(tables[k], after[k]) for k in tables)
    assert changed is moves


@pytest.mark.parametrize("mode", ["single_tower", "offline", "online", "offline_then_online"])
def test_single_tower_modes_route_both_kinds_to_one_tower(tiny, mode):
    _, job = tiny
    stepper = Stepper(job, mode=mode)
    assert stepper.graph_for("batch") == stepper.graph_for("stream") == "memory"
    assert stepper.model.adapt_parameters() == []
    with pytest.raises(ValueError, match="minibatch kind"):
        stepper.graph_for("bogus")


def test_served_output_and_state_round_trip(tiny):
    _, job = tiny
    batch = _batch(job)
    stepper = Stepper(job, mode="mtrm")
    for kind in ("batch", "stream", "batch"):
        stepper.step(kind, batch)
    served, memory = stepper.predict(batch), stepper.predict(batch, output="memory")
    assert served.shape == (64,) and not np.allclose(served, memory)  # default serve: adapt
    clone = Stepper(job, mode="mtrm", seed=99)
    buffer = io.BytesIO()  # as a checkpoint does: serialise, then load into a fresh process' model
    torch.save(stepper.state_dict(), buffer)
    buffer.seek(0)
    clone.load_state_dict(torch.load(buffer, weights_only=False))
    np.testing.assert_array_equal(clone.predict(batch), served)
    a, b = stepper.step("stream", batch), clone.step("stream", batch)  # optimizer state restored too
    assert a.loss == b.loss
    np.testing.assert_array_equal(clone.predict(batch), stepper.predict(batch))


def test_a_step_after_predict_trains_in_training_mode_and_matches_one_without(tiny):
    _, job = tiny
    batch = _batch(job)
    served, plain = Stepper(job, mode="mtrm"), Stepper(job, mode="mtrm")
    served.predict(batch)
    assert not any(m.training for m in served.model.modules())  # predict() switched to eval
    a, b = served.step("stream", batch), plain.step("stream", batch)
    assert all(m.training for m in served.model.modules())  # the step switched back, every module
    assert a.loss == b.loss
    np.testing.assert_array_equal(a.probs, b.probs)


def test_row_ids_are_read_only_when_asked_for(tiny):
    _, job = tiny
    assert _batch(job).ids[:2] == ["r0", "r1"]
    table = pa.table({"request_id": ["a", "b"], "clicked": [1.0, 0.0], "ts": [1, 2], "user_id": [1, 2],
                      "item_id": [3, 4], "category": [5, 6], "price": [1.0, 2.0], "age": [20.0, 30.0]})  # fmt: skip
    assert to_batch(table, job.spec.features).ids is None
    assert to_batch(table, job.spec.features, "request_id").ids == ["a", "b"]
