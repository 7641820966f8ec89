"""The delayed-feedback correction (delayed.py), on every mode's stream steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from primus_lib.spec.training import ModelSpec
from primus_lib.train.model.delayed import UNINFORMED, Completeness, complete_logit, likelihood_loss, stream_loss
from primus_lib.train.model.objective import forward
from primus_lib.train.model.stepper import LocalStepper
from tests.train.test_steps import _batch


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


def test_stream_loss_is_the_likelihood_or_plain_bce():
    labels = torch.tensor([1.0, 0.0, 0.0])
    logit = torch.tensor([0.0, 0.0, math.log(0.2 / 0.8)])
    torch.testing.assert_close(stream_loss("likelihood", logit, labels, 0.75), likelihood_loss(logit, labels, 0.75))
    torch.testing.assert_close(
        stream_loss("none", logit, labels, 0.75), F.binary_cross_entropy_with_logits(logit, labels, reduction="none")
    )
    with pytest.raises(ValueError, match="stream_correction"):
        stream_loss("soft", logit, labels, 0.8)


def test_completeness_is_the_ratio_of_click_rates():
    estimate = Completeness(halflife_rows=1e6, before=UNINFORMED)
    assert estimate.value == UNINFORMED == 0.5  # nothing seen: a uniform prior's mean
    estimate.update("stream", torch.ones(8))
    assert estimate.value == UNINFORMED  # one kind alone: still no ratio
    rng = np.random.default_rng(0)
    for _ in range(200):
        estimate.update("batch", torch.tensor(rng.random(512) < 0.10, dtype=torch.float32))
        estimate.update("stream", torch.tensor(rng.random(512) < 0.08, dtype=torch.float32))
    assert 0.75 < estimate.value < 0.85
    clone = Completeness()
    clone.load_state_dict(estimate.state_dict())
    assert clone.value == estimate.value
    assert Completeness().value == 1.0 and Completeness(fixed=0.7, before=UNINFORMED).value == 0.7


def test_spec_options_default_and_refuse_unknown_and_removed_fields():
    spec = ModelSpec()
    assert (spec.serve, spec.stream_correction, spec.memory_tower, spec.adapt_tower) == (
        "mixture",
        "likelihood",
        [128, 64],
        [128, 64],
    )
    with pytest.raises(ValueError, match="stream_correction"):
        ModelSpec(stream_correction="soft")
    with pytest.raises(ValueError, match="batch_embedding_scale: removed in the MTRM of docs/training.md"):
        ModelSpec(batch_embedding_scale=0.5)


def test_every_mode_corrects_its_stream_steps_and_a_known_completeness_is_used_as_given(tiny):
    """The correction is each mode's (the baselines get it too): a stream step's loss is the likelihood
    under ``c``; online never sees complete labels, so its ``c`` stays 1 unless given (eval's ``c=``)."""
    _, job = tiny
    batch = _batch(job, seed=3)
    for mode in ("single_tower", "online", "offline_then_online", "mtrm"):
        plain, corrected = (
            LocalStepper(job, mode=mode, correction="none"),
            LocalStepper(job, mode=mode, completeness=0.5),
        )
        assert corrected.evidence.c == 0.5
        a, b = plain.step("stream", batch), corrected.step("stream", batch)
        assert a.loss != b.loss, mode
    online = LocalStepper(job, mode="online")
    online.step("stream", batch)
    assert online.evidence.c == 1.0  # no batch rows will come: plain BCE
    for mode in ("single_tower", "offline_then_online", "mtrm"):  # complete labels will come: the prior until then
        before = LocalStepper(job, mode=mode)
        before.step("stream", batch)
        assert before.evidence.c == UNINFORMED, mode
    both = LocalStepper(job, mode="single_tower")
    both.step("batch", batch)
    both.step("stream", batch)
    assert both.evidence.c == 1.0  # the same rows' labels on both sides: every click seen by the stream


def test_a_real_time_probability_is_read_as_a_complete_label_one_through_c():
    q = torch.tensor([0.1, 0.3, 0.45, 0.9])
    p = torch.sigmoid(complete_logit(torch.logit(q), 0.5))
    torch.testing.assert_close(p[:3], torch.tensor([0.2, 0.6, 0.9]))
    assert 0.999 < float(p[3]) < 1.0  # q / c above 1 is capped below it
    logits = torch.tensor([-2.0, 0.0, 3.0])
    assert torch.equal(complete_logit(logits, 1.0), logits)  # every click seen: the output as it is


def test_mtrms_adapt_tower_fits_the_real_time_label_and_is_served_through_c(tiny):
    """Under ``likelihood`` the memory and reread towers' stream loss is the likelihood, the adapt tower's plain
    BCE on the real-time label; its output ``q`` is recorded and served as ``q / c``. Under ``none``: as it is."""
    _, job = tiny
    batch = _batch(job, seed=3)
    for correction, c in (("likelihood", 0.5), ("none", 1.0)):
        stepper = LocalStepper(job, mode="mtrm", completeness=0.5, correction=correction)
        x = stepper.model.features(batch.sparse, batch.dense)
        out = forward(stepper.model, stepper.config, "stream", x, batch.labels, stepper.evidence)
        memory = stepper.model.memory_forward(x)
        adapt = stepper.model.adapt_forward(x, memory)
        memory_loss = stream_loss(correction, memory, batch.labels, 0.5)
        reread_loss = stream_loss(correction, stepper.model.reread_forward(x), batch.labels, 0.5)
        adapt_loss = F.binary_cross_entropy_with_logits(adapt, batch.labels, reduction="none")
        expected = memory_loss + adapt_loss + reread_loss
        torch.testing.assert_close(out.loss, expected)
        complete = (torch.sigmoid(adapt) / c).clamp(1e-7, 1 - 1e-6).detach()
        torch.testing.assert_close(torch.sigmoid(out.adapt_logit), complete)
        np.testing.assert_allclose(stepper.predict(batch, output="adapt"), complete.numpy(), rtol=1e-5)
