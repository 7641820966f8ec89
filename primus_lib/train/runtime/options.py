"""How one trainer run behaves (``primus train`` flags, test and benchmark aids)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass
class TrainerOptions:
    until_window: str | None = None
    max_steps: int | None = None
    mode: str | None = None
    poll_interval: float = 2.0
    checkpoint_steps: int | None = None
    idle_exit: float | None = None
    switch_at: datetime | None = None  # offline_then_online; default modes.default_switch(job)
    sample_log: Path | None = None  # --sample-log: the sample ids of each step (sample_log.py)
    high_water: int = 4  # minibatches a buffer reads ahead
    prefetch: bool = True  # read the feeds in a background thread
    step_delay: float = 0.0  # test aid (primus train --step-delay): sleep after each step
    flush_grace: float | None = None  # seconds a drained batch feed waits before a partial step; None: poll_interval
    metrics: bool = True  # the scaler's input metrics (snapshots, an HTTP endpoint); off in the backtest
