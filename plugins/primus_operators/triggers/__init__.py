"""Triggers: wait without holding a worker slot (partition markers, trainer progress)."""

from __future__ import annotations

from primus_operators.triggers.source_ready import SourceReadyTrigger
from primus_operators.triggers.trainer_progress import TrainerProgressTrigger

__all__ = ["SourceReadyTrigger", "TrainerProgressTrigger"]
