"""The MTRM network: shared TorchRec embeddings, a memory tower and an adapt tower.

The memory tower sees ``[embeddings, dense]``; the adapt tower sees
``[embeddings, dense, h_aux]`` where ``h_aux`` is what ``spec.model.h_aux`` names of the memory
tower (its logit, last hidden layer, both, or nothing), computed without gradient (Algorithm 1).
With ``blend`` a serving head of three numbers, ``a * logit_A + b * logit_M + bias``, maps both
towers to the served logit; it is fitted on complete labels (batch steps, detached logits), so it
calibrates without moving either tower. Single-tower modes use the memory tower alone.
Embeddings are a TorchRec (Fused)EmbeddingBagCollection whose row-wise Adagrad update runs
inside backward: a minibatch kind that must not update the embeddings detaches them, so no
gradient (and no update) reaches the tables.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from primus_lib.spec.training import FeaturesSpec, ModelSpec

# torchrec's import trips a one-line torch.fx deprecation warning on every start: not ours.
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


@dataclass(frozen=True)
class ModelOptions:
    """Choices the spec leaves to the implementation (ablations switch them)."""

    aux: str | None = None  # what h_aux carries: "logit" | "hidden+logit" | "hidden" | "none" (None: the spec's)
    adapt_residual: bool = False  # adapt logit = adapt head + memory logit (no grad into memory)
    fused: bool = True  # FusedEmbeddingBagCollection (single process); False: EBC for DMP sharding
    replicated: bool = False  # plain CPU EBC, dense gradients all-reduced, RowWiseAdagrad stepped by the Stepper
    blend: bool = False  # a serving head over both towers' logits (spec.model.serve "blend")


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers)


def build_embeddings(features: FeaturesSpec, dim: int, sparse_lr: float, fused: bool) -> nn.Module:
    tables = [
        EmbeddingBagConfig(name=f"t_{f.name}", embedding_dim=dim, num_embeddings=f.buckets, feature_names=[f.name])
        for f in features.sparse
    ]
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    if fused:
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

        return FusedEmbeddingBagCollection(
            tables=tables, optimizer_type=RowWiseAdagrad, optimizer_kwargs={"lr": sparse_lr}, device=torch.device("cpu")
        )
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": sparse_lr})
    return ebc


def replicated_embeddings(features: FeaturesSpec, dim: int) -> nn.Module:
    """A plain EBC on the CPU: each data-parallel rank holds all tables, gradients are all-reduced."""
    tables = [
        EmbeddingBagConfig(name=f"t_{f.name}", embedding_dim=dim, num_embeddings=f.buckets, feature_names=[f.name])
        for f in features.sparse
    ]
    return EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))


class TwoTowerModel(nn.Module):
    def __init__(
        self,
        features: FeaturesSpec,
        spec: ModelSpec,
        *,
        two_towers: bool,
        sparse_lr: float,
        options: ModelOptions | None = None,
    ):
        super().__init__()
        options = options or ModelOptions()
        self.options = options if options.aux else replace(options, aux=spec.h_aux)
        self.keys = [f.name for f in features.sparse]
        self.n_dense = len(features.dense)
        if self.options.replicated:
            self.embeddings = replicated_embeddings(features, spec.embedding_dim)
        else:
            self.embeddings = build_embeddings(features, spec.embedding_dim, sparse_lr, self.options.fused)
        width = spec.embedding_dim * len(self.keys) + self.n_dense
        self.memory = mlp([width, *spec.memory_tower])
        self.memory_head = nn.Linear(spec.memory_tower[-1], 1)
        self.two_towers = two_towers
        if two_towers:
            aux = {"hidden+logit": spec.memory_tower[-1] + 1, "logit": 1, "hidden": spec.memory_tower[-1], "none": 0}
            if self.options.aux not in aux:
                raise ValueError(f"model option aux: expected one of {sorted(aux)}, got {self.options.aux!r}")
            self.adapt = mlp([width + aux[self.options.aux], *spec.adapt_tower])
            self.adapt_head = nn.Linear(spec.adapt_tower[-1], 1)
            if spec.adapt_init == "memory":
                self.start_adapt_as_memory()
            if self.options.blend:
                self.blend = nn.Linear(2, 1)  # starts as the adapt tower alone: a = 1, b = 0, bias = 0
                with torch.no_grad():
                    self.blend.weight.copy_(torch.tensor([[1.0, 0.0]]))
                    self.blend.bias.zero_()

    @torch.no_grad()
    def start_adapt_as_memory(self) -> None:
        """``adapt_init: memory``: the adapt tower starts as the memory tower, the ``h_aux`` inputs (the
        last columns of its first layer) at zero weight. A single tower of the same seed draws the same
        tables and memory-tower weights, so MTRM's served tower starts where it starts: a paired
        comparison then measures the training, not two draws of the initial weights."""
        for src, dst in zip(self.memory, self.adapt, strict=True):
            if isinstance(src, nn.Linear):
                dst.weight.zero_()
                dst.weight[:, : src.in_features].copy_(src.weight)
                dst.bias.copy_(src.bias)
        self.adapt_head.load_state_dict(self.memory_head.state_dict())

    def embed(self, sparse: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embeddings(sparse)
        return torch.cat([pooled[k] for k in self.keys], dim=1)

    def inputs(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        if not self.n_dense:
            return emb
        return torch.cat([emb, torch.sign(dense) * torch.log1p(dense.abs())], dim=1)

    def memory_forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.memory(x)
        return self.memory_head(hidden).squeeze(1), hidden

    def adapt_forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Adapt logit and the (gradient-free) memory logit it was built on."""
        with torch.no_grad():
            m_logit, m_hidden = self.memory_forward(x.detach())
        parts = {"hidden+logit": [m_hidden, m_logit[:, None]], "logit": [m_logit[:, None]], "hidden": [m_hidden],
                 "none": []}  # fmt: skip
        h_aux = parts[self.options.aux]
        logit = self.adapt_head(self.adapt(torch.cat([x, *h_aux], dim=1))).squeeze(1)
        if self.options.adapt_residual:
            logit = logit + m_logit
        return logit, m_logit

    def blend_logit(self, adapt_logit: torch.Tensor, memory_logit: torch.Tensor) -> torch.Tensor:
        """The served logit of ``serve: blend`` (gradient only into the blend head)."""
        both = torch.stack([adapt_logit.detach(), memory_logit.detach()], dim=1)
        return self.blend(both).squeeze(1)

    def blend_parameters(self) -> list[nn.Parameter]:
        return list(self.blend.parameters()) if self.two_towers and self.options.blend else []

    def memory_parameters(self) -> list[nn.Parameter]:
        return [*self.memory.parameters(), *self.memory_head.parameters()]

    def adapt_parameters(self) -> list[nn.Parameter]:
        return [*self.adapt.parameters(), *self.adapt_head.parameters()] if self.two_towers else []
