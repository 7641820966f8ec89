"""The bare TorchRec loop of ``bench/train.py``: the same model shape written from TorchRec's
documented API alone (nothing from ``primus_lib``), so the trainer is measured against ordinary
TorchRec code rather than against its own step.

- tables: one ``EmbeddingBagConfig`` per sparse feature (sum pooling), row-wise Adagrad applied
  in backward, either through ``FusedEmbeddingBagCollection(optimizer_type=RowWiseAdagrad)``
  (``tables="fused"``) or an ``EmbeddingBagCollection`` with ``apply_optimizer_in_backward``
  (``tables="in_backward"``);
- towers: an MLP per tower (``Linear``/``ReLU`` layers, a ``Linear`` head to one logit) over
  the pooled embeddings and the dense features; one ``torch.optim.Adam`` per tower;
- single tower: every minibatch trains the tower and the tables (binary cross-entropy);
- MTRM's shape (``two_towers``, the flag's old name): a batch minibatch trains the memory tower and the
  tables and a third tower (the reread tower, the memory tower's sizes) over a collection of its own
  tables and the dense features; a stream minibatch trains all three, the adapt tower reading the
  embeddings and the memory logit detached and a second collection of its own tables (every
  collection as wide, row-wise Adagrad in backward);
- minibatches: ``KeyedJaggedTensor.from_lengths_sync`` and dense/label tensors, all built before
  the clock starts (``build_batches``).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
from torch import nn
from torch.nn import functional as F
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad


@dataclass(frozen=True)
class Shape:
    sparse: dict[str, int]  # feature -> buckets
    dense: list[str]
    label: str
    dim: int
    memory: list[int]
    adapt: list[int]
    lr: float
    sparse_lr: float


@dataclass
class MiniBatch:
    kind: str  # "batch" | "stream"
    sparse: KeyedJaggedTensor
    dense: torch.Tensor
    labels: torch.Tensor


def build_batches(shape: Shape, minibatches: list[tuple[str, pa.Table]]) -> list[MiniBatch]:
    """Arrow rows -> KJTs (one id per feature and row) and tensors, before timing."""
    keys = list(shape.sparse)
    out = []
    for kind, table in minibatches:
        n = table.num_rows
        values = np.concatenate([table.column(k).to_numpy() for k in keys]).astype(np.int64)
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=torch.from_numpy(values), lengths=torch.ones(n * len(keys), dtype=torch.int32)
        )
        dense = np.stack([table.column(k).to_numpy() for k in shape.dense], axis=1).astype(np.float32)
        dense = np.sign(dense) * np.log1p(np.abs(dense))
        labels = table.column(shape.label).to_numpy().astype(np.float32)
        out.append(MiniBatch(kind, sparse, torch.from_numpy(dense), torch.from_numpy(labels)))
    return out


def _mlp(width: int, sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in sizes:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    return nn.Sequential(*layers, nn.Linear(width, 1))


class BareModel(nn.Module):
    def __init__(self, shape: Shape, two_towers: bool, tables: str = "fused"):
        super().__init__()
        self.ebc = _collection(shape, _configs(shape, "t_"), tables)
        width = shape.dim * len(shape.sparse) + len(shape.dense)
        self.memory = _mlp(width, shape.memory)
        self.adapt, self.adapt_ebc, self.reread, self.reread_ebc = None, None, None, None
        if two_towers:
            self.adapt_ebc = _collection(shape, _configs(shape, "a_"), tables)
            self.adapt = _mlp(width + shape.dim * len(shape.sparse) + 1, shape.adapt)
            self.reread_ebc = _collection(shape, _configs(shape, "r_"), tables)
            self.reread = _mlp(width, shape.memory)


def _configs(shape: Shape, prefix: str) -> list[EmbeddingBagConfig]:
    """One table per sparse feature, named ``prefix`` + the feature."""
    return [
        EmbeddingBagConfig(name=f"{prefix}{k}", embedding_dim=shape.dim, num_embeddings=n, feature_names=[k])
        for k, n in shape.sparse.items()
    ]


def _collection(shape: Shape, configs: list[EmbeddingBagConfig], tables: str) -> nn.Module:
    cpu = torch.device("cpu")
    if tables == "fused":
        return FusedEmbeddingBagCollection(
            tables=configs, optimizer_type=RowWiseAdagrad, optimizer_kwargs={"lr": shape.sparse_lr}, device=cpu
        )
    ebc = EmbeddingBagCollection(tables=configs, device=cpu)
    with warnings.catch_warnings():  # "deprecated: use torch.distributed's": the documented name
        warnings.simplefilter("ignore", DeprecationWarning)
        apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": shape.sparse_lr})
    return ebc


class BareLoop:
    """A plain training loop: forward, loss, backward (tables updated in it), the towers' Adam."""

    def __init__(self, shape: Shape, two_towers: bool, tables: str = "fused"):
        self.model = BareModel(shape, two_towers, tables)
        self.memory_opt = torch.optim.Adam(self.model.memory.parameters(), lr=shape.lr)
        self.adapt_opt = torch.optim.Adam(self.model.adapt.parameters(), lr=shape.lr) if two_towers else None
        self.reread_opt = torch.optim.Adam(self.model.reread.parameters(), lr=shape.lr) if two_towers else None

    def step(self, b: MiniBatch) -> float:
        x = torch.cat([self.model.ebc(b.sparse).values(), b.dense], dim=1)
        memory_logit = self.model.memory(x).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(memory_logit, b.labels)
        both = b.kind == "stream" and self.adapt_opt is not None
        if both:
            own = self.model.adapt_ebc(b.sparse).values()
            h = torch.cat([x.detach(), own, memory_logit.detach()[:, None]], dim=1)
            loss = loss + F.binary_cross_entropy_with_logits(self.model.adapt(h).squeeze(1), b.labels)
            self.adapt_opt.zero_grad()
        if self.reread_opt is not None:
            r = torch.cat([self.model.reread_ebc(b.sparse).values(), b.dense], dim=1)
            loss = loss + F.binary_cross_entropy_with_logits(self.model.reread(r).squeeze(1), b.labels)
            self.reread_opt.zero_grad()
        self.memory_opt.zero_grad()
        loss.backward()
        self.memory_opt.step()
        if both:
            self.adapt_opt.step()
        if self.reread_opt is not None:
            self.reread_opt.step()
        return float(loss.detach())


def run(shape: Shape, minibatches: list[tuple[str, pa.Table]], two_towers: bool, tables: str = "fused") -> dict:
    """Samples per second of the loop (model construction included, minibatches prebuilt)."""
    batches = build_batches(shape, minibatches)
    began, cpu = time.perf_counter(), time.thread_time()
    loop = BareLoop(shape, two_towers, tables)
    rows = 0
    for b in batches:
        loop.step(b)
        rows += b.labels.shape[0]
    wall, cpu = time.perf_counter() - began, time.thread_time() - cpu
    return {"rows": rows, "wall_s": wall, "samples_per_s": rows / wall, "samples_per_thread_cpu_s": rows / cpu}
