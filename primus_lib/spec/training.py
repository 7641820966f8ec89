"""What the model sees (features), what it is (model), and how it learns (training)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from primus_lib.spec.base import SpecModel
from primus_lib.spec.types import Duration

TrainingMode = Literal["mtrm", "single_tower", "offline", "online", "offline_then_online"]
CompleteLabelPass = Literal["off", "tower", "tables"]
COMPLETE_LABEL_PASSES: tuple[str, ...] = get_args(CompleteLabelPass)
AdaptInit = Literal["independent", "memory"]
ADAPT_INITS: tuple[str, ...] = get_args(AdaptInit)


def complete_label_pass_name(value: object) -> object:
    """Spec files written before the pass had two kinds said true/false: still read, as tower/off."""
    if isinstance(value, bool):
        return "tower" if value else "off"
    return value


class SparseFeature(SpecModel):
    name: str = Field(min_length=1)
    buckets: int = Field(gt=0, description="Ids are hashed into this many embedding rows.")


class FeaturesSpec(SpecModel):
    """The sample schema every source decodes into."""

    label: str = Field(min_length=1)
    timestamp: str = Field(min_length=1)
    id: str | None = Field(None, description="Column that identifies a sample (for exactly-once checks).")
    sparse: list[SparseFeature] = Field(min_length=1)
    dense: list[str] = Field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        return [self.label, self.timestamp, *(f.name for f in self.sparse), *self.dense]


class ModelSpec(SpecModel):
    embedding_dim: int = Field(16, gt=0)
    memory_tower: list[int] = Field(min_length=1)
    adapt_tower: list[int] = Field(min_length=1)
    embedding_updates: Literal["batch", "stream", "both"] = Field(
        "both", description="Which minibatch kinds update the shared embeddings."
    )
    serve: Literal["adapt", "memory", "blend"] = Field(
        "adapt",
        description="MTRM's served output: a tower, or blend (a * adapt + b * memory + bias in logits, "
        "fitted on batch steps' complete labels).",
    )
    stream_correction: Literal["none", "likelihood", "soft"] = Field(
        "soft",
        description="MTRM's delayed-feedback correction of the stream (real-time) label on the adapt tower "
        "(docs/training.md).",
    )
    soft_after_rows: int = Field(
        0,
        ge=0,
        description="MTRM with stream_correction soft: use likelihood instead until the memory tower has trained "
        "on this many complete-labelled (batch) rows; soft leans on the memory tower's odds, which a cold "
        "start does not have yet (docs/training.md).",
    )
    batch_embedding_scale: float = Field(
        0.5,
        ge=0,
        le=1,
        description="MTRM: batch steps' gradient on the shared embeddings is scaled by this (the value seen is "
        "unchanged; 1: as the stream's; docs/training.md).",
    )
    complete_label_pass: CompleteLabelPass = Field(
        "off",
        description="MTRM: batch rows (complete labels) also train the served adapt tower. tower: its weights "
        "only (tables detached); tables: its weights and, through it, the shared tables, which the memory "
        "tower then reads without moving (docs/training.md).",
    )
    complete_label_weight: float = Field(
        1.0,
        gt=0,
        le=1,
        description="MTRM: the complete-label pass's loss is weighted by this against the memory tower's (the "
        "served tower has seen each batch row once already, on the stream; docs/training.md).",
    )
    h_aux: Literal["logit", "hidden", "hidden+logit", "none"] = Field(
        "logit",
        description="MTRM: what the adapt tower gets from the memory tower (Algorithm 1's h_aux, computed "
        "without gradient): its logit, its last hidden layer, both, or nothing.",
    )

    adapt_init: AdaptInit = Field(
        "independent",
        description="MTRM: the adapt tower's initial weights: drawn on their own, or a copy of the memory tower's "
        "(h_aux inputs at zero weight; needs adapt_tower equal to memory_tower), so the served tower starts where "
        "a single tower of the same seed starts (docs/training.md, tenth round).",
    )

    _pass_from_bool = field_validator("complete_label_pass", mode="before")(complete_label_pass_name)

    @model_validator(mode="after")
    def _adapt_init_shapes(self) -> ModelSpec:
        if self.adapt_init == "memory" and self.adapt_tower != self.memory_tower:
            raise ValueError(
                f"adapt_init: memory copies the memory tower's weights: adapt_tower must equal memory_tower "
                f"({self.memory_tower}), got {self.adapt_tower}"
            )
        return self


class TrainingSpec(SpecModel):
    mode: TrainingMode = "mtrm"
    batch_size: int = Field(512, gt=0)
    learning_rate: float = Field(0.01, gt=0)
    sparse_learning_rate: float = Field(
        0.5,
        gt=0,
        description="Row-wise Adagrad's rate on the embedding rows (default 0.5, chosen on the backtest's "
        "development seeds for every mode; learning_rate barely moves them).",
    )
    priority: dict[str, float] = Field(default_factory=dict, description="Importance weight per stream.")
    checkpoint_interval: Duration | None = Field(None, description="Default: after every batch window.")
    seed: int = 0
