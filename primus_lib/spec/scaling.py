"""The Dynamic Scaling Manager's policies."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from primus_lib.spec.base import SpecModel
from primus_lib.spec.types import Duration


class HorizontalScaling(SpecModel):
    """L_u = w . [buffer, cpu, memory utilisation] against ``threshold``."""

    enabled: bool = True
    weights: list[float] = Field([0.8, 0.1, 0.1], min_length=3, max_length=3)  # why: docs/scaling.md
    threshold: float = Field(0.5, ge=0, le=1)
    cooldown: Duration = timedelta(seconds=60)
    step: float = Field(
        0.25,
        gt=0,
        le=1,
        description="Largest change per decision, as a fraction of the pool; stream executors sized "
        "from the rates they measure (behind their source, or caught up with it) are bounded by "
        "min_replicas and max_replicas only.",
    )


class VerticalScaling(SpecModel):
    """Peak usage in ``lookback`` + forecast + ``safety_margin``; skip changes under ``min_change``."""

    enabled: bool = True
    lookback: Duration = timedelta(minutes=10)
    safety_margin: float = Field(0.15, ge=0)
    min_change: float = Field(0.25, ge=0)
    oom_growth: float = Field(0.5, gt=0, description="Grow memory by this fraction after an OOM kill.")


class ScalingSpec(SpecModel):
    horizontal: HorizontalScaling = HorizontalScaling()
    vertical: VerticalScaling = VerticalScaling()
    interval: Duration = Field(
        timedelta(minutes=1),
        description="Time between scaling decisions. Stream executors and trainers report their metrics at "
        "a twelfth of it, every 1-5 s, so a decision never reads reports older than that.",
    )
