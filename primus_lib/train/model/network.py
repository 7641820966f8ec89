"""The MTRM network: shared TorchRec embeddings, a memory tower, an adapt tower with fresh tables and a
reread tower with tables of its own.

The memory tower reads ``[embeddings, dense]``. The adapt tower also reads ``h_aux``, the memory tower's
logit computed without gradient (Algorithm 1), and its own fresh tables (one per sparse feature, as
wide as the shared ones) that only its stream loss moves; it reads the shared tables without moving
them. So the shared tables and the memory tower train exactly as the single tower's, and in a world
whose tastes turn, the adapt tower has embeddings that yesterday's rows never pulled back. The reread
tower reads ``[dense, its tables]`` and trains on every row each time a row is read (the paper's
single tower: a streamed row's batch copy is a second epoch), which the memory tower, trained once per
impression, is not (``objective.py``). The cost is a second and a third copy of every table
(docs/training.md). Single-tower modes build the memory tower alone.
Embeddings are one TorchRec EmbeddingBagCollection of every table (MTRM's three sets read the same
features): fused (one process: row-wise Adagrad runs inside backward), replicated (data-parallel
ranks: plain tables, gradients all-reduced, Adagrad stepped by the stepper) or, for DMP sharding, one
whose in-backward optimizer DMP fuses into its shards. One collection is one lookup a step: on
bench/train.py's tables and 512-row minibatches, three collections' lookups (forward and backward) took
0.51 ms of an MTRM stream step against 0.28 for the nine tables in one, a batch step's two (its fresh
lookup now goes unused) 0.35 against 0.28; MTRM went from 0.81 to 0.85x the bare TorchRec loop
(2026-12-07). The cost: MTRM's start draws its tables apart, then copies them in (+44 ms).
"""

from __future__ import annotations

import logging
from typing import Literal, NamedTuple

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


# the tables' name prefixes: the shared tables, the adapt tower's own, the reread tower's own
SHARED, FRESH, REREAD = "t_", "fresh_", "reread_"
TABLES = "embeddings.embedding_bags."  # where every table's weight is named
# until 2026-12-07 MTRM's fresh and reread tables were collections of their own, and named by them
LEGACY = {FRESH: "fresh.embedding_bags.", REREAD: "reread_tables.embedding_bags."}


def current_name(name: str) -> str:
    """A weight's name in this model, given its name in a checkpoint of either layout."""
    for table, old in LEGACY.items():
        if name.startswith(old + table):
            return TABLES + name[len(old) :]
    return name


def table_names(features: FeaturesSpec, two_towers: bool) -> list[str]:
    prefixes = (SHARED, FRESH, REREAD) if two_towers else (SHARED,)
    return [f"{prefix}{f.name}" for prefix in prefixes for f in features.sparse]


def _configs(features: FeaturesSpec, dim: int, prefix: str) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"{prefix}{f.name}", embedding_dim=dim, num_embeddings=f.buckets, feature_names=[f.name]
        )
        for f in features.sparse
    ]


def build_embeddings(
    features: FeaturesSpec, dim: int, sparse_lr: float, tables: Tables, prefixes: tuple[str, ...] = (SHARED,)
) -> nn.Module:
    """The tables of ``tables`` kind (see the module docstring), one per prefix and sparse feature,
    named prefix + the feature, in that order."""
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    configs = [config for prefix in prefixes for config in _configs(features, dim, prefix)]
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


def _joined(parts: list[nn.Module], features: FeaturesSpec, dim: int, sparse_lr: float, tables: Tables) -> nn.Module:
    """One collection of every table of ``parts`` (MTRM's: shared, fresh, reread), holding their weights.
    The parts were drawn where they always were, between the towers, so under one seed every weight
    starts as it did in three collections (and MTRM's shared tables and memory tower as the single
    tower's); the joined collection's own initial draws are made on a forked generator and dropped."""
    with torch.random.fork_rng(devices=[]):
        joined = build_embeddings(features, dim, sparse_lr, tables, (SHARED, FRESH, REREAD))
    if tables != "sharded":  # sharded: on the meta device, DMP draws them as it places the shards
        joined.load_state_dict({name: w for part in parts for name, w in part.state_dict().items()})
    return joined


class TowerInputs(NamedTuple):
    """A minibatch's features kept apart: each tower concatenates those it reads. (One wide tensor sliced
    per tower cost every slice's backward a zero-filled copy of the whole width: 3% of MTRM's step.)"""

    shared: torch.Tensor  # the shared tables' pooled embeddings
    dense: torch.Tensor  # the dense features, log-scaled (no columns when there are none)
    reread: torch.Tensor | None = None  # the reread tower's tables' (MTRM)
    fresh: torch.Tensor | None = None  # the adapt tower's fresh tables' (MTRM's stream steps)


class TwoTowerModel(nn.Module):
    def __init__(
        self, features: FeaturesSpec, spec: ModelSpec, *, two_towers: bool, sparse_lr: float, tables: Tables = "fused"
    ):
        super().__init__()
        self.tables = tables
        self.keys = [f.name for f in features.sparse]
        self.n_dense = len(features.dense)
        dim = spec.embedding_dim
        self.embeddings = build_embeddings(features, dim, sparse_lr, tables)
        self.set_width = dim * len(self.keys)  # one set of tables' pooled columns
        self.width = self.set_width + self.n_dense  # the memory tower's input
        self.memory = mlp([self.width, *spec.memory_tower])
        self.memory_head = nn.Linear(spec.memory_tower[-1], 1)
        self.two_towers = two_towers
        if two_towers:  # drawn after the memory tower: a single tower of the same seed starts as it does
            fresh = build_embeddings(features, dim, sparse_lr, tables, (FRESH,))
            self.adapt = mlp([self.width + self.set_width + 1, *spec.adapt_tower])
            self.adapt_head = nn.Linear(spec.adapt_tower[-1], 1)
            # drawn last: the memory and adapt towers start as they would without it
            reread = build_embeddings(features, dim, sparse_lr, tables, (REREAD,))
            self.reread = mlp([self.width, *spec.memory_tower])
            self.reread_head = nn.Linear(spec.memory_tower[-1], 1)
            self.embeddings = _joined([self.embeddings, fresh, reread], features, dim, sparse_lr, tables)
        # the pooled columns' names in table order (a feature several tables read: "feature@table")
        prefixes = (SHARED, FRESH, REREAD) if two_towers else (SHARED,)
        self.pooled_keys = [f"{k}@{p}{k}" if two_towers else k for p in prefixes for k in self.keys]

    def _pooled(self, sparse: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embeddings(sparse)
        if pooled.keys() == self.pooled_keys:  # the tables' order (always, unless a collection reorders them)
            return pooled.values()
        return torch.cat([pooled[k] for k in self.pooled_keys], dim=1)

    def features(self, sparse: KeyedJaggedTensor, dense: torch.Tensor, *, fresh: bool = True) -> TowerInputs:
        """The towers' inputs (MTRM's fresh embeddings unless ``fresh`` is False: a batch step has no use for
        them, and its backward leaves the fresh tables as they are): the memory tower reads ``[shared,
        dense]``, the reread tower ``[dense, reread]``, the adapt tower ``[shared, dense, fresh]``."""
        pooled = self._pooled(sparse)
        dense = torch.sign(dense) * torch.log1p(dense.abs()) if self.n_dense else pooled[:, :0]
        if not self.two_towers:
            return TowerInputs(pooled, dense)
        shared, fresh_embeddings, reread = torch.split(pooled, self.set_width, dim=1)
        return TowerInputs(shared, dense, reread, fresh_embeddings if fresh else None)

    def memory_forward(self, x: TowerInputs) -> torch.Tensor:
        inputs = torch.cat([x.shared, x.dense], dim=1) if self.n_dense else x.shared  # ``width`` columns
        return self.memory_head(self.memory(inputs)).squeeze(1)

    def reread_forward(self, x: TowerInputs) -> torch.Tensor:
        """The reread tower's logit on ``[dense, its tables]``."""
        if x.reread is None:
            raise ValueError("the reread tower reads its own tables: MTRM's features() (mode mtrm)")
        return self.reread_head(self.reread(torch.cat([x.dense, x.reread], dim=1))).squeeze(1)

    def adapt_forward(self, x: TowerInputs, memory_logit: torch.Tensor) -> torch.Tensor:
        """The adapt logit on ``x`` (its shared columns without gradient: the adapt tower does not move the
        shared tables) and ``h_aux``, the memory logit (no gradient flows back into it)."""
        if x.fresh is None:
            raise ValueError("the adapt tower reads its fresh tables: build x with features(..., fresh=True)")
        inputs = [x.shared.detach(), x.dense, x.fresh, memory_logit.detach()[:, None]]
        return self.adapt_head(self.adapt(torch.cat(inputs, dim=1))).squeeze(1)

    def table_parameters(self) -> list[nn.Parameter]:
        """Every table's weights: the shared ones, then (MTRM) the adapt tower's fresh ones and the reread tower's."""
        return list(self.embeddings.parameters())

    def memory_parameters(self) -> list[nn.Parameter]:
        return [*self.memory.parameters(), *self.memory_head.parameters()]

    def adapt_parameters(self) -> list[nn.Parameter]:
        return [*self.adapt.parameters(), *self.adapt_head.parameters()] if self.two_towers else []

    def reread_parameters(self) -> list[nn.Parameter]:
        return [*self.reread.parameters(), *self.reread_head.parameters()] if self.two_towers else []

    def tower_parameters(self, tower: str) -> list[nn.Parameter]:
        """``tower``'s weights ("memory" | "adapt" | "reread"), its tables apart."""
        by_tower = {"memory": self.memory_parameters, "adapt": self.adapt_parameters, "reread": self.reread_parameters}
        return by_tower[tower]()

    def dense_parameters(self) -> list[nn.Parameter]:
        return [*self.memory_parameters(), *self.adapt_parameters(), *self.reread_parameters()]
