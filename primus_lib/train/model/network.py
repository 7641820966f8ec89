"""The MTRM network: shared TorchRec embeddings, a memory tower and an adapt tower.

Both towers read ``[embeddings, dense]``; the adapt tower also reads ``h_aux``, the memory tower's
logit computed without gradient (Algorithm 1). Single-tower modes build the memory tower alone.
Embeddings are a TorchRec EmbeddingBagCollection: fused (one process: row-wise Adagrad runs inside
backward), replicated (data-parallel ranks: plain tables, gradients all-reduced, Adagrad stepped
by the stepper) or, for DMP sharding, one whose in-backward optimizer DMP fuses into its shards.
A tower that must not move the tables reads them detached: no gradient reaches them.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from primus_lib.spec.training import FeaturesSpec, ModelSpec

# torchrec's import trips a one-line torch.fx deprecation warning on every start: not ours.
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)

Tables = Literal["fused", "replicated", "sharded"]


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers)


def _configs(features: FeaturesSpec, dim: int) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=f"t_{f.name}", embedding_dim=dim, num_embeddings=f.buckets, feature_names=[f.name])
        for f in features.sparse
    ]


def build_embeddings(features: FeaturesSpec, dim: int, sparse_lr: float, tables: Tables) -> nn.Module:
    """The tables of ``tables`` kind (see the module docstring)."""
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    configs = _configs(features, dim)
    if tables == "replicated":
        return EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    if tables == "fused":
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

        return FusedEmbeddingBagCollection(
            tables=configs,
            optimizer_type=RowWiseAdagrad,
            optimizer_kwargs={"lr": sparse_lr},
            device=torch.device("cpu"),
        )
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": sparse_lr})
    return ebc


class TwoTowerModel(nn.Module):
    def __init__(
        self, features: FeaturesSpec, spec: ModelSpec, *, two_towers: bool, sparse_lr: float, tables: Tables = "fused"
    ):
        super().__init__()
        self.tables = tables
        self.keys = [f.name for f in features.sparse]
        self.n_dense = len(features.dense)
        self.embeddings = build_embeddings(features, spec.embedding_dim, sparse_lr, tables)
        width = spec.embedding_dim * len(self.keys) + self.n_dense
        self.memory = mlp([width, *spec.memory_tower])
        self.memory_head = nn.Linear(spec.memory_tower[-1], 1)
        self.two_towers = two_towers
        if two_towers:  # drawn after the memory tower: a single tower of the same seed starts as it does
            self.adapt = mlp([width + 1, *spec.adapt_tower])
            self.adapt_head = nn.Linear(spec.adapt_tower[-1], 1)

    def embed(self, sparse: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embeddings(sparse)
        if pooled.keys() == self.keys:  # the tables' order (always, unless a collection reorders them)
            return pooled.values()
        return torch.cat([pooled[k] for k in self.keys], dim=1)

    def inputs(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        if not self.n_dense:
            return emb
        return torch.cat([emb, torch.sign(dense) * torch.log1p(dense.abs())], dim=1)

    def memory_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.memory_head(self.memory(x)).squeeze(1)

    def adapt_forward(self, x: torch.Tensor, memory_logit: torch.Tensor) -> torch.Tensor:
        """The adapt logit on ``x`` and ``h_aux``, the memory logit (no gradient flows back into it)."""
        h_aux = memory_logit.detach()[:, None]
        return self.adapt_head(self.adapt(torch.cat([x, h_aux], dim=1))).squeeze(1)

    def memory_parameters(self) -> list[nn.Parameter]:
        return [*self.memory.parameters(), *self.memory_head.parameters()]

    def adapt_parameters(self) -> list[nn.Parameter]:
        return [*self.adapt.parameters(), *self.adapt_head.parameters()] if self.two_towers else []

    def dense_parameters(self) -> list[nn.Parameter]:
        return [*self.memory_parameters(), *self.adapt_parameters()]
