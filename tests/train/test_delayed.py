"""The delayed-feedback correction (delayed.py) and MTRM's serving head / complete-label pass."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from primus_lib.spec.training import ModelSpec
from primus_lib.train.delayed import Completeness, correction_now, likelihood_loss, soft_targets, stream_loss
from primus_lib.train.steps import Stepper
from tests.train.test_steps import _batch, _equal, _snapshot, _tables


@pytest.mark.parametrize("c", [0.3, 0.8, 0.999, 1.0])
def test_likelihood_loss_is_the_observed_label_likelihood(c):
    logit = torch.linspace(-6, 6, 25, dtype=torch.float64)
    p = torch.sigmoid(logit)
    for y in (0.0, 1.0):
        labels = torch.full_like(logit, y)
        expected = -(y * torch.log(c * p) + (1 - y) * torch.log(1 - c * p))
        torch.testing.assert_close(likelihood_loss(logit, labels, c), expected)
    labels = (torch.arange(25) % 3 == 0).double()
    if c == 1.0:  # no missed clicks: plain BCE
        torch.testing.assert_close(
            likelihood_loss(logit, labels, c), F.binary_cross_entropy_with_logits(logit, labels, reduction="none")
        )


def test_likelihood_loss_recovers_the_complete_click_rate():
    """Observed rate c * p: the expected loss is minimal where sigmoid(logit) = p, not c * p."""
    p, c = 0.12, 0.8
    logit = torch.tensor([math.log(p / (1 - p))], dtype=torch.float64, requires_grad=True)
    expected = c * p * likelihood_loss(logit, torch.ones(1, dtype=torch.float64), c) + (1 - c * p) * likelihood_loss(
        logit, torch.zeros(1, dtype=torch.float64), c
    )
    expected.sum().backward()
    assert abs(float(logit.grad)) < 1e-9
    plain = c * p * F.softplus(-logit) + (1 - c * p) * F.softplus(logit)  # uncorrected BCE's optimum is c * p
    (grad,) = torch.autograd.grad(plain.sum(), logit)
    assert float(grad) > 1e-3


def test_soft_targets_are_the_fake_negative_probability():
    labels = torch.tensor([1.0, 0.0, 0.0])
    memory_logit = torch.tensor([0.0, 0.0, math.log(0.2 / 0.8)])
    targets = soft_targets(labels, memory_logit, 0.75)
    torch.testing.assert_close(targets, torch.tensor([1.0, 0.5 * 0.25 / (1 - 0.375), 0.2 * 0.25 / (1 - 0.15)]))
    torch.testing.assert_close(soft_targets(labels, memory_logit, 1.0), labels)
    with pytest.raises(ValueError, match="stream_correction"):
        stream_loss("bogus", memory_logit, labels, 0.8, None)


def test_completeness_is_the_ratio_of_click_rates():
    estimate = Completeness(halflife_rows=1e6)
    assert estimate.value == 1.0  # nothing seen: no correction
    rng = np.random.default_rng(0)
    for _ in range(200):
        estimate.update("batch", torch.tensor(rng.random(512) < 0.10, dtype=torch.float32))
        estimate.update("stream", torch.tensor(rng.random(512) < 0.08, dtype=torch.float32))
    assert 0.75 < estimate.value < 0.85
    clone = Completeness()
    clone.load_state_dict(estimate.state_dict())
    assert clone.value == estimate.value


def test_spec_options_default_and_refuse_unknown_values():
    spec = ModelSpec(memory_tower=[8], adapt_tower=[8])
    assert (spec.serve, spec.stream_correction, spec.complete_label_pass, spec.h_aux) == (
        "adapt",
        "soft",
        "off",
        "logit",
    )
    assert ModelSpec(memory_tower=[8], adapt_tower=[8], complete_label_pass=True).complete_label_pass == "tower"
    with pytest.raises(ValueError, match="stream_correction"):
        ModelSpec(memory_tower=[8], adapt_tower=[8], stream_correction="fnw")


def test_soft_waits_for_the_memory_tower_rows():
    assert [correction_now("soft", rows, 100) for rows in (0, 99, 100, 5000)] == ["likelihood"] * 2 + ["soft"] * 2
    assert correction_now("soft", 0, 0) == "soft"  # the default: soft from the first step
    assert correction_now("none", 0, 100) == "none" and correction_now("likelihood", 500, 100) == "likelihood"
    with pytest.raises(ValueError, match="soft_after_rows"):
        ModelSpec(memory_tower=[8], adapt_tower=[8], soft_after_rows=-1)


def test_stepper_uses_likelihood_until_the_memory_tower_saw_soft_after_rows(tiny):
    """A stream step's loss is likelihood's until ``soft_after_rows`` batch rows trained the memory
    tower (64-row batches: two), soft's after; the count survives a checkpoint."""
    _, job = tiny

    def stream_losses(correction: str, after: int) -> list[float]:
        stepper = Stepper(job, mode="mtrm", stream_correction=correction, soft_after_rows=after, seed=3)
        losses = []
        for step in range(3):
            stepper.step("batch", _batch(job, seed=10 + step))
            losses.append(stepper.step("stream", _batch(job, seed=20 + step)).loss)
        assert stepper.memory_rows == 3 * 64
        return losses

    waiting, likelihood, soft = stream_losses("soft", 128), stream_losses("likelihood", 0), stream_losses("soft", 0)
    assert waiting[0] == likelihood[0] and waiting[0] != soft[0]  # 64 rows seen: still likelihood
    # 128 rows seen: soft, on the very model the likelihood run has at that step (its steps were the same)
    assert waiting[1] != likelihood[1]
    stepper = Stepper(job, mode="mtrm", soft_after_rows=128)
    stepper.step("batch", _batch(job, seed=1))
    assert stepper.stream_correction() == "likelihood"
    stepper.step("batch", _batch(job, seed=2))
    assert stepper.stream_correction() == "soft"
    clone = Stepper(job, mode="mtrm", soft_after_rows=128)
    clone.load_state_dict(stepper.state_dict())
    assert clone.memory_rows == 128 and clone.stream_correction() == "soft"
    assert Stepper(job, mode="mtrm").soft_after_rows == job.spec.model.soft_after_rows == 0


def test_blend_head_moves_on_batch_steps_only(tiny):
    _, job = tiny
    stepper = Stepper(job, mode="mtrm", serve="blend", stream_correction="likelihood")
    blend, adapt = _snapshot(stepper.model.blend_parameters()), _snapshot(stepper.model.adapt_parameters())
    stepper.step("batch", _batch(job, seed=1))
    assert not _equal(blend, stepper.model.blend_parameters()), "a batch step did not fit the blend head"
    assert _equal(adapt, stepper.model.adapt_parameters()), "a batch step changed the adapt tower"
    blend, memory = _snapshot(stepper.model.blend_parameters()), _snapshot(stepper.model.memory_parameters())
    stepper.step("stream", _batch(job, seed=2))
    assert _equal(blend, stepper.model.blend_parameters()) and _equal(memory, stepper.model.memory_parameters())
    batch = _batch(job)
    clone = Stepper(job, mode="mtrm", serve="blend", stream_correction="likelihood", seed=5)
    buffer = io.BytesIO()
    torch.save(stepper.state_dict(), buffer)
    buffer.seek(0)
    clone.load_state_dict(torch.load(buffer, weights_only=False))
    np.testing.assert_array_equal(clone.predict(batch), stepper.predict(batch))
    assert clone.completeness.state_dict() == stepper.completeness.state_dict()


def test_complete_label_pass_trains_adapt_weights_not_tables(tiny):
    _, job = tiny
    stepper = Stepper(job, mode="mtrm", embedding_updates="stream", complete_label_pass=True)
    adapt, tables = _snapshot(stepper.model.adapt_parameters()), _tables(stepper)
    stepper.step("batch", _batch(job, seed=1))
    assert not _equal(adapt, stepper.model.adapt_parameters()), "the complete-label pass did not train the adapt tower"
    assert all(torch.equal(v, _tables(stepper)[k]) for k, v in tables.items()), "the second pass moved the tables"
    memory = _snapshot(stepper.model.memory_parameters())
    stepper.step("stream", _batch(job, seed=2))
    assert _equal(memory, stepper.model.memory_parameters()), "a stream step changed the memory tower"


def test_complete_label_pass_into_the_tables_moves_them_through_the_served_tower_only(tiny):
    _, job = tiny
    stepper = Stepper(job, mode="mtrm", complete_label_pass="tables", batch_embedding_scale=1.0)
    assert stepper.second_pass == "tables" and stepper.model.options.aux == "logit"
    batch = _batch(job, seed=1)
    x = stepper.tower_inputs("batch", batch)
    per_row, memory_logit = stepper.forward_loss("batch", "memory", x, batch.labels)
    memory_loss = F.binary_cross_entropy_with_logits(memory_logit, batch.labels)
    (from_memory,) = torch.autograd.grad(memory_loss, x, allow_unused=True, retain_graph=True)
    assert from_memory is None, "the memory tower's loss reached the tables"
    (from_both,) = torch.autograd.grad(per_row.sum(), x)
    assert float(from_both.abs().sum()) > 0, "the served tower's pass on batch rows did not reach the tables"
    adapt, memory, tables = (
        _snapshot(stepper.model.adapt_parameters()),
        _snapshot(stepper.model.memory_parameters()),
        _tables(stepper),
    )
    stepper.step("batch", batch)
    assert not _equal(adapt, stepper.model.adapt_parameters()) and not _equal(memory, stepper.model.memory_parameters())
    assert any(not torch.equal(v, _tables(stepper)[k]) for k, v in tables.items()), "the batch step left the tables"
    tower = Stepper(job, mode="mtrm", complete_label_pass="tower")
    x = tower.tower_inputs("batch", batch)
    per_row, memory_logit = tower.forward_loss("batch", "memory", x, batch.labels)
    (whole,) = torch.autograd.grad(per_row.sum(), x, retain_graph=True)
    (memory_only,) = torch.autograd.grad(
        F.binary_cross_entropy_with_logits(memory_logit, batch.labels, reduction="sum"), x
    )
    torch.testing.assert_close(whole, memory_only)  # "tower": the tables learn from the memory tower alone


def test_complete_label_weight_scales_the_served_pass_alone_and_comes_from_the_spec(tiny):
    _, job = tiny
    batch = _batch(job, seed=1)

    def parts(weight: float | None, spec_weight: float = 1.0):
        model = job.spec.model.model_copy(update={"complete_label_weight": spec_weight})
        weighted = job.model_copy(update={"spec": job.spec.model_copy(update={"model": model})})
        stepper = Stepper(weighted, mode="mtrm", complete_label_pass="tables", complete_label_weight=weight, seed=3)
        x = stepper.tower_inputs("batch", batch)
        per_row, memory_logit = stepper.forward_loss("batch", "memory", x, batch.labels)
        memory = F.binary_cross_entropy_with_logits(memory_logit, batch.labels, reduction="none")
        return stepper.second_weight, per_row.detach() - memory.detach()

    _, full = parts(None)
    weight, quarter = parts(0.25)
    torch.testing.assert_close(quarter, 0.25 * full)  # the memory tower's own loss is not scaled
    assert weight == 0.25 and parts(None, spec_weight=0.5)[0] == 0.5
    with pytest.raises(ValueError, match="complete_label_weight"):
        Stepper(job, mode="mtrm", complete_label_pass="tables", complete_label_weight=0.0)
    with pytest.raises(ValueError, match="complete_label_weight"):
        ModelSpec(memory_tower=[8], adapt_tower=[8], complete_label_weight=1.5)


def test_h_aux_comes_from_the_spec_unless_an_option_overrides_it(tiny):
    _, job = tiny
    spec = job.spec.model_copy(update={"model": job.spec.model.model_copy(update={"h_aux": "none"})})
    stepper = Stepper(job.model_copy(update={"spec": spec}), mode="mtrm")
    width = stepper.model.memory[0].in_features
    assert stepper.model.options.aux == "none" and stepper.model.adapt[0].in_features == width
    assert Stepper(job, mode="mtrm").model.adapt[0].in_features == width + 1
    with pytest.raises(ValueError, match="complete_label_pass"):
        Stepper(job, mode="mtrm", complete_label_pass="both")
