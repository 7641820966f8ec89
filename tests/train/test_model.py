"""The network's construction: under one seed MTRM's memory tower and tables start where the single tower's do."""

from __future__ import annotations

import torch

from primus_lib.train.model.stepper import LocalStepper


def test_mtrm_starts_its_memory_tower_and_tables_as_the_single_tower_and_feeds_h_aux_to_the_adapt_tower(tiny):
    _, job = tiny
    mtrm, single = LocalStepper(job, mode="mtrm", seed=11).model, LocalStepper(job, mode="single_tower", seed=11).model
    for a, b in zip(mtrm.memory_parameters(), single.memory_parameters(), strict=True):
        assert torch.equal(a, b)
    for name, table in single.embeddings.state_dict().items():
        assert torch.equal(table, mtrm.embeddings.state_dict()[name])
    width = mtrm.memory[0].in_features
    assert mtrm.adapt[0].in_features == width + 1  # the memory logit as h_aux
    assert single.adapt_parameters() == [] and not hasattr(single, "adapt")
