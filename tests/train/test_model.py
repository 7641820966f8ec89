"""The network's construction: ``adapt_init: memory`` starts the served tower where a single tower starts."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from primus_lib.spec.training import ModelSpec
from primus_lib.train.backtest import BacktestOptions, RunConfig, _configured, run_backtest
from primus_lib.train.eval_sources import EvalInputError
from primus_lib.train.steps import Stepper

from .test_steps import _batch


def _equal_towers(job, h_aux="logit"):
    model = job.spec.model.model_copy(update={"adapt_tower": job.spec.model.memory_tower, "h_aux": h_aux})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"model": model})})


def test_adapt_tower_starts_as_the_memory_tower_with_zero_weight_on_h_aux(tiny):
    _, job = tiny
    job = _configured(_equal_towers(job), RunConfig.parse("mtrm[init=memory]"))
    model = Stepper(job, mode="mtrm", seed=5).model
    first_memory, first_adapt = model.memory[0], model.adapt[0]
    assert first_adapt.weight.shape[1] == first_memory.weight.shape[1] + 1  # the memory logit as h_aux
    assert torch.equal(first_adapt.weight[:, :-1], first_memory.weight)
    assert not first_adapt.weight[:, -1].any(), "h_aux's column starts at zero"
    pairs = zip([*model.memory.parameters(), *model.memory_head.parameters()][1:],
                [*model.adapt.parameters(), *model.adapt_head.parameters()][1:], strict=True)  # fmt: skip
    assert all(torch.equal(m, a) for m, a in pairs)
    batch = _batch(job)
    with torch.no_grad():
        x = model.inputs(model.embed(batch.sparse), batch.dense)
        adapt_logit, memory_logit = model.adapt_forward(x)
    torch.testing.assert_close(adapt_logit, memory_logit)


def test_mtrm_served_tower_starts_where_single_tower_of_the_same_seed_starts(tiny):
    """The paired comparison's common random numbers: same seed, same initial served weights and tables."""
    _, job = tiny
    job = _equal_towers(job, h_aux="none")
    single = Stepper(job, mode="single_tower", seed=11).model
    mtrm = Stepper(_configured(job, RunConfig.parse("mtrm[init=memory]")), mode="mtrm", seed=11).model
    served = [*mtrm.adapt.parameters(), *mtrm.adapt_head.parameters()]
    tower = [*single.memory.parameters(), *single.memory_head.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(served, tower, strict=True))
    tables, other = single.embeddings.state_dict(), mtrm.embeddings.state_dict()
    assert all(torch.equal(tables[k], other[k]) for k in tables)
    independent = Stepper(job, mode="mtrm", seed=11).model
    assert not torch.equal(independent.adapt[0].weight, single.memory[0].weight)


def test_adapt_init_memory_needs_equal_tower_sizes():
    with pytest.raises(ValidationError, match="adapt_tower must equal memory_tower"):
        ModelSpec(memory_tower=[16, 8], adapt_tower=[8], adapt_init="memory")
    assert ModelSpec(memory_tower=[16, 8], adapt_tower=[8]).adapt_init == "independent"


def test_eval_rejects_adapt_init_memory_with_unequal_towers_before_any_data(tiny, tmp_path):
    _, job = tiny
    runs = [RunConfig.parse("mtrm[init=memory]")]  # the tiny spec's towers are 32-16 and 16-8
    options = BacktestOptions(out=tmp_path / "out", data=None, runs=runs, seeds=[0], data_seeds=True)
    with pytest.raises(EvalInputError, match=r"mtrm\[init=memory\]: .*adapt_tower must equal memory_tower"):
        run_backtest(job, options)
    assert not (tmp_path / "out").exists()
