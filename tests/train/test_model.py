"""The network's construction: under one seed MTRM's memory tower and shared tables start where the single
tower's do; the adapt tower reads them, ``h_aux`` and its own fresh tables; the reread tower its own tables."""

from __future__ import annotations

import pytest
import torch

from primus_lib.train.model.stepper import LocalStepper
from tests.train.conftest import minibatch


def test_mtrm_starts_its_memory_tower_and_tables_as_the_single_tower_and_feeds_h_aux_to_the_adapt_tower(tiny):
    _, job = tiny
    mtrm, single = LocalStepper(job, mode="mtrm", seed=11).model, LocalStepper(job, mode="single_tower", seed=11).model
    for a, b in zip(mtrm.memory_parameters(), single.memory_parameters(), strict=True):
        assert torch.equal(a, b)
    tables = mtrm.embeddings.state_dict()  # one collection of all three sets
    for name, table in single.embeddings.state_dict().items():
        assert name.startswith("embedding_bags.t_") and torch.equal(table, tables[name])
    width = mtrm.memory[0].in_features
    fresh = [name for name in tables if name.startswith("embedding_bags.fresh_")]
    assert len(fresh) == len(single.embeddings.state_dict())  # one fresh table per shared one, as wide
    assert mtrm.adapt[0].in_features == width + job.spec.model.embedding_dim * len(mtrm.keys) + 1  # + h_aux
    assert single.adapt_parameters() == [] and not hasattr(single, "adapt")
    assert len([name for name in tables if name.startswith("embedding_bags.reread_")]) == len(fresh)  # and as wide
    assert mtrm.reread[0].in_features == width and not hasattr(single, "reread")
    assert len(mtrm.table_parameters()) == len(tables) == 3 * len(single.table_parameters())


def test_a_checkpoint_of_another_model_is_refused_by_name(tiny):
    """An MTRM checkpoint written before the fresh tables (or by a single tower) names what it lacks."""
    _, job = tiny
    single, mtrm = LocalStepper(job, mode="single_tower", seed=3), LocalStepper(job, mode="mtrm", seed=3)
    state = mtrm.state_dict()
    state["model"] = {k: v for k, v in state["model"].items() if ".fresh_" not in k}
    with pytest.raises(ValueError, match=r"lacks 3 of the model's weights \(embeddings\.embedding_bags\.fresh_"):
        LocalStepper(job, mode="mtrm", seed=3).load_state_dict(state)
    before_reread = {k: v for k, v in mtrm.state_dict()["model"].items() if "reread" not in k}
    with pytest.raises(ValueError, match=r"lacks 9 of the model's weights \(embeddings\.embedding_bags\.reread_"):
        LocalStepper(job, mode="mtrm", seed=3).load_state_dict({**mtrm.state_dict(), "model": before_reread})
    LocalStepper(job, mode="mtrm", seed=5).load_state_dict(mtrm.state_dict())  # the same model round-trips
    assert single.model.state_dict().keys() < mtrm.model.state_dict().keys()


def test_an_mtrm_checkpoint_from_three_collections_resumes(tiny):
    """Until 2026-12-07 the fresh and reread tables were collections of their own, named ``fresh.`` and
    ``reread_tables.`` in a checkpoint (its sparse optimizer's state was named by table, as now)."""
    _, job = tiny
    mtrm = LocalStepper(job, mode="mtrm", seed=3)
    mtrm.step("stream", minibatch(job, seed=1))
    old = {"fresh_": "fresh.embedding_bags.fresh_", "reread_": "reread_tables.embedding_bags.reread_"}
    state = mtrm.state_dict()
    renamed = {}
    for name, weight in state["model"].items():
        table = name.removeprefix("embeddings.embedding_bags.")
        prefix = next((p for p in old if table.startswith(p) and table != name), None)
        renamed[old[prefix] + table.removeprefix(prefix) if prefix else name] = weight
    assert sum(k.startswith("fresh.") for k in renamed) == sum(k.startswith("reread_tables.") for k in renamed) > 0
    resumed = LocalStepper(job, mode="mtrm", seed=5)
    resumed.load_state_dict({**state, "model": renamed})
    for name, weight in mtrm.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], weight), name


def test_each_tower_reads_its_own_columns_and_a_missing_input_is_named(tiny):
    """The memory tower reads ``[shared, dense]``, the reread tower ``[dense, its tables]``, the adapt tower
    ``[shared, dense, fresh, h_aux]``: each logit is its MLP on exactly those columns."""
    _, job = tiny
    model = LocalStepper(job, mode="mtrm", seed=2).model
    batch = minibatch(job)
    with torch.no_grad():
        x = model.features(batch.sparse, batch.dense)
        assert x.shared.shape[1] + x.dense.shape[1] == model.width == x.dense.shape[1] + x.reread.shape[1]
        memory = model.memory_head(model.memory(torch.cat([x.shared, x.dense], dim=1))).squeeze(1)
        assert torch.equal(model.memory_forward(x), memory)
        reread = model.reread_head(model.reread(torch.cat([x.dense, x.reread], dim=1))).squeeze(1)
        assert torch.equal(model.reread_forward(x), reread)
        adapt_in = torch.cat([x.shared, x.dense, x.fresh, memory[:, None]], dim=1)
        assert torch.equal(model.adapt_forward(x, memory), model.adapt_head(model.adapt(adapt_in)).squeeze(1))
        batch_x = model.features(batch.sparse, batch.dense, fresh=False)
    assert batch_x.fresh is None
    with pytest.raises(ValueError, match="the adapt tower reads its fresh tables"):
        model.adapt_forward(batch_x, memory)
    single = LocalStepper(job, mode="single_tower", seed=2).model
    with pytest.raises(ValueError, match="the reread tower reads its own tables"):
        single.reread_forward(single.features(batch.sparse, batch.dense))
