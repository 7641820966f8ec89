"""The training modes, defined once: which data each reads, how many towers it trains, when
offline_then_online switches. Read by the spec checks, the trainer, the CLI and the backtest,
so a mode cannot mean one thing in ``primus train`` and another in ``primus eval``; what each
minibatch kind trains is ``objective.py``'s table.

Free of torch: the CLI imports it to check ``--mode`` before loading anything heavy.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, get_args

from primus_lib.spec.checks import MODE_NEEDS
from primus_lib.spec.training import TrainingMode

if TYPE_CHECKING:
    from primus_lib.spec.job import PrimusJob

# The names are the spec's (``TrainingMode``), the data each reads is the spec checks' table:
# the spec layer may not import the trainer, so the definitions live there and this module
# is where the trainer, the CLI and eval read them.
MODES: tuple[str, ...] = get_args(TrainingMode)
NEEDS: dict[str, tuple[str, ...]] = MODE_NEEDS
TWO_TOWERS = frozenset({"mtrm"})  # every other mode trains one tower (the memory tower's sizes)
SWITCHING = frozenset({"offline_then_online"})  # batch first, then the stream from the switch on


def check_mode(mode: str) -> str:
    """``mode`` if it is one, else ValueError naming the known ones."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {'|'.join(MODES)}")
    return mode


def reads(mode: str, kind: str) -> bool:
    """Whether ``mode`` reads data streams of ``kind`` ("batch" | "stream")."""
    return kind in NEEDS[check_mode(mode)]


def two_towers(mode: str) -> bool:
    return check_mode(mode) in TWO_TOWERS


def switches(mode: str) -> bool:
    """offline_then_online: the stream takes over from the batch at the switch instant."""
    return check_mode(mode) in SWITCHING


def max_lag(job: PrimusJob) -> timedelta:
    """The largest lag of the job's batch streams (zero without any)."""
    return max((s.lag for s in job.batch_streams), default=timedelta(0))


def default_switch(job: PrimusJob) -> datetime:
    """offline_then_online switches to the stream one day after the first batch window exists
    (the backtest's first scored window)."""
    return job.spec.timer.start + max_lag(job) + timedelta(days=1)


KINDS = ("batch", "stream")
