"""The towers' Adam: one fused optimizer with a parameter group per tower.

A step trains two or three towers; one ``Adam.step`` each cost ~70 us of Python a call (a step of
MTRM's is 4-5 ms on bench/train.py's minibatches). One optimizer steps them in one call and moves each
tower exactly as its own Adam would: a tower the step did not train has no gradients, which Adam
skips, and every tensor keeps its own step count. Its state reads and writes as one Adam state per
tower (``{tower: state}``), the checkpoints' format.
"""

from __future__ import annotations

import torch


class TowerAdam:
    """Adam over ``towers`` (name -> parameters, one group each). Fused unless ``adam`` says otherwise: one
    kernel for the tensors, CPU and CUDA alike, a third of the multi-tensor path's time; its weights agree
    with the single-tensor Adam's to float rounding (tests/train/test_steps.py)."""

    def __init__(self, towers: dict[str, list[torch.nn.Parameter]], lr: float, **adam):
        self.towers = list(towers)
        self.settings = {"fused": True, **adam}
        groups = [{"params": params} for params in towers.values()]
        self.optimizer = torch.optim.Adam(groups, lr=lr, **self.settings)

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def step(self) -> None:
        self.optimizer.step()

    def state_dict(self) -> dict[str, dict]:
        """One Adam state per tower, its tensors numbered from 0 as that tower's own Adam numbers them."""
        whole = self.optimizer.state_dict()
        out, first = {}, 0
        for tower, group in zip(self.towers, whole["param_groups"], strict=True):
            ids = group["params"]
            out[tower] = {
                "state": {i - first: whole["state"][i] for i in ids if i in whole["state"]},
                "param_groups": [{**group, "params": [i - first for i in ids]}],
            }
            first += len(ids)
        return out

    def load_state_dict(self, state: dict[str, dict]) -> None:
        """``state_dict``'s form; the settings (fused, foreach) stay ours: older checkpoints ran unfused."""
        missing = [t for t in self.towers if t not in state]
        if missing:
            raise ValueError(f"the checkpoint has no optimizer state for the {', '.join(missing)} tower(s)")
        whole: dict = {"state": {}, "param_groups": []}
        first = 0
        for tower in self.towers:
            (group,) = state[tower]["param_groups"]
            whole["state"].update({int(i) + first: s for i, s in state[tower]["state"].items()})
            whole["param_groups"].append({**group, "params": [i + first for i in group["params"]]})
            first += len(group["params"])
        self.optimizer.load_state_dict(whole)
        for group in self.optimizer.param_groups:
            group["foreach"], group["fused"] = self.settings.get("foreach"), self.settings.get("fused")
