"""The Timer of the Data Task Graph: which time windows the job trains on."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field

from primus_lib.spec.base import SpecModel
from primus_lib.spec.types import UtcDatetime
from primus_lib.timegrid import window_size


class TimerSpec(SpecModel):
    """Windows of ``window`` from ``start``; no ``end`` means open-ended (follows the clock)."""

    start: UtcDatetime
    end: UtcDatetime | None = None
    window: Literal["1h", "1d"] = "1h"
    catchup: bool = Field(True, description="Run windows between start and now that were missed.")

    @property
    def window_size(self) -> timedelta:
        return window_size(self.window)
