from __future__ import annotations

import io

import pytest
import torch

from primus_lib.train.model.tower_adam import TowerAdam


def _towers(seed: int) -> dict[str, list[torch.nn.Parameter]]:
    torch.manual_seed(seed)
    return {name: list(torch.nn.Linear(4, 3).parameters()) for name in ("memory", "adapt", "reread")}


def _train(towers, optimizers_step, kinds) -> None:
    """Steps in which some towers train and the others have no gradients (as a batch step leaves the adapt tower)."""
    for i, trained in enumerate(kinds):
        for name, params in towers.items():
            for p in params:
                p.grad = None if name not in trained else torch.full_like(p, 0.1 * (i + 1)) * p.detach().sign()
        optimizers_step()


KINDS = [("memory", "adapt", "reread"), ("memory", "reread"), ("memory", "adapt", "reread"), ("memory",)]


def test_one_optimizer_moves_each_tower_exactly_as_its_own_adam_and_saves_in_its_form():
    ours, theirs = _towers(0), _towers(0)
    merged = TowerAdam(ours, lr=0.01)
    own = {name: torch.optim.Adam(params, lr=0.01, fused=True) for name, params in theirs.items()}
    _train(ours, merged.step, KINDS)
    _train(theirs, lambda: [opt.step() for opt in own.values()], KINDS)
    for name in ours:
        for a, b in zip(ours[name], theirs[name], strict=True):
            assert torch.equal(a, b)
    state = merged.state_dict()
    assert list(state) == ["memory", "adapt", "reread"]
    for name, opt in own.items():  # the checkpoints' format: one Adam state per tower
        expected = opt.state_dict()
        assert state[name]["param_groups"] == expected["param_groups"]
        assert state[name]["state"].keys() == expected["state"].keys()
        for i, s in expected["state"].items():
            assert all(torch.equal(s[k], state[name]["state"][i][k]) for k in s)
    assert int(state["adapt"]["state"][0]["step"]) == 2  # trained in two steps of four: its own count


def test_a_resumed_optimizer_continues_as_the_saved_one_and_keeps_its_settings():
    a, b = _towers(1), _towers(1)
    first = TowerAdam(a, lr=0.01, fused=False, foreach=False)  # an older checkpoint's, unfused
    _train(a, first.step, KINDS)
    for x, y in zip(a.values(), b.values(), strict=True):
        for p, q in zip(x, y, strict=True):
            q.data.copy_(p.data)
    resumed = TowerAdam(b, lr=0.01)
    saved = io.BytesIO()  # as a checkpoint stores it (a state loaded from memory would share its tensors)
    torch.save(first.state_dict(), saved)
    resumed.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    assert all(g["fused"] and g["foreach"] is None for g in resumed.param_groups)
    _train(a, first.step, KINDS[:2])
    _train(b, resumed.step, KINDS[:2])
    for name in a:
        for p, q in zip(a[name], b[name], strict=True):
            torch.testing.assert_close(p, q)  # fused against single-tensor: to float rounding
    with pytest.raises(ValueError, match="no optimizer state for the reread tower"):
        TowerAdam(_towers(2), lr=0.01).load_state_dict({k: v for k, v in first.state_dict().items() if k != "reread"})
