"""What the model sees (features), what it is (model), and how it learns (training)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, model_validator

from primus_lib.spec.base import SpecModel
from primus_lib.spec.types import Duration

TrainingMode = Literal["mtrm", "single_tower", "offline", "online", "offline_then_online"]
ServedOutput = Literal["mixture", "mean", "adapt", "memory", "reread"]
StreamCorrection = Literal["likelihood", "none"]
ShardingType = Literal["table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise"]
# model fields of earlier designs: a spec that still sets one gets told so, not "unknown field"
REMOVED_MODEL_FIELDS = (
    "embedding_updates",
    "soft_after_rows",
    "batch_embedding_scale",
    "complete_label_pass",
    "complete_label_weight",
    "h_aux",
    "adapt_init",
)


class SparseFeature(SpecModel):
    name: str = Field(min_length=1)
    buckets: int = Field(gt=0, description="Ids are hashed into this many embedding rows.")


class FeaturesSpec(SpecModel):
    """The sample schema every source decodes into."""

    label: str = Field(min_length=1)
    timestamp: str = Field(min_length=1)
    id: str | None = Field(
        None,
        description="Column that identifies a sample: the exactly-once checks and the once rule (a batch row's "
        "stream copy is found by it) read it; unset: the first join key.",
    )
    sparse: list[SparseFeature] = Field(min_length=1)
    dense: list[str] = Field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        return [self.label, self.timestamp, *(f.name for f in self.sparse), *self.dense]


class ModelSpec(SpecModel):
    """MTRM's network (docs/training.md): the memory tower trains on every row the mode reads, the adapt
    tower on stream rows only, reading the memory tower's logit (``h_aux``) and the shared tables without
    gradient, and fresh tables of its own."""

    embedding_dim: int = Field(
        16,
        gt=0,
        description="Width of every embedding table's rows (mtrm holds each table three times: the adapt tower's "
        "own and the reread tower's).",
    )
    memory_tower: list[int] = Field(
        default_factory=lambda: [128, 64],
        min_length=1,
        description="Hidden sizes of the memory tower (the one tower of single-tower modes) and of MTRM's reread "
        "tower.",
    )
    adapt_tower: list[int] = Field(
        default_factory=lambda: [128, 64], min_length=1, description="Hidden sizes of MTRM's adapt tower."
    )
    serve: ServedOutput = Field(
        "mixture",
        description="MTRM's served output: the mixture of blends of its towers' logits (the memory or the reread "
        "tower with the adapt tower, in steps of a quarter), weighted by how well each ranked clicks above non-clicks "
        "(AUC) on complete labels a day later and, at once, on real-time labels (progressive validation in the "
        "trainer); or the memory and adapt towers' mean, or one tower (single-tower modes serve their tower).",
    )
    stream_correction: StreamCorrection = Field(
        "likelihood",
        description="Every mode's loss on stream rows, whose real-time label misses late clicks: likelihood fits "
        "the complete-label probability through P(real-time click) = c p, c estimated from the click rates; none: "
        "plain BCE.",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: object) -> object:
        if isinstance(data, dict):
            for name in REMOVED_MODEL_FIELDS:
                if name in data:
                    raise ValueError(f"{name}: removed in the MTRM of docs/training.md (one default): delete it")
        return data


class TrainingSpec(SpecModel):
    mode: TrainingMode = Field(
        "mtrm", description='What the trainer trains and serves (docs/training.md, "Choosing a mode").'
    )
    batch_size: int = Field(512, gt=0, description="Rows of a minibatch (one kind of data per minibatch).")
    learning_rate: float = Field(
        0.004, gt=0, description="Adam's rate on the towers (chosen on the development worlds for every mode)."
    )
    sparse_learning_rate: float = Field(
        0.5,
        gt=0,
        description="Row-wise Adagrad's rate on the embedding rows (default 0.5, chosen on the backtest's "
        "development seeds for every mode; learning_rate barely moves them).",
    )
    priority: dict[str, float] = Field(
        default_factory=dict,
        description="Importance weight per stream (default 1): each ready buffer's share of the rows trained is "
        "proportional to weight * sigmoid(queued minibatches).",
    )
    checkpoint_interval: Duration | None = Field(None, description="Default: after every batch window.")
    seed: int = Field(0, description="Draws the model's starting weights.")
    collective_timeout: Duration = Field(
        timedelta(minutes=30),
        description="Under torchrun: how long a rank waits in a collective for the others before it fails.",
    )
    sharding: Literal["replicate", "dmp"] | None = Field(
        None,
        description="Embedding tables of a trainer under torchrun: every rank holds them all on the CPU "
        "(replicate), or TorchRec's DistributedModelParallel shards them across the ranks, on each rank's GPU "
        "where it has one (dmp; one rank too). Default: dmp when resources.roles.trainer asks for GPUs "
        "(replicate is refused there: the GPUs would sit idle), else replicate.",
    )
    sharding_types: list[ShardingType] | None = Field(
        None,
        description="dmp: the sharding types the planner may choose (default: table_wise on the CPU, "
        "table_wise/row_wise/column_wise/table_row_wise on CUDA).",
    )
