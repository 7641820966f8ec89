"""The modes are defined once: the spec's names, the spec checks' table, the trainer's and
eval's rules all agree, and `primus eval` runs the trainer's own loop."""

from __future__ import annotations

from typing import get_args

import pytest

from primus_lib.evaluation.backtest import RunConfig
from primus_lib.spec.checks import MODE_NEEDS
from primus_lib.spec.training import TrainingMode
from primus_lib.train.model import modes
from tests.train.conftest import START


def test_one_table_of_modes():
    assert modes.MODES == get_args(TrainingMode)
    assert modes.NEEDS is MODE_NEEDS and set(MODE_NEEDS) == set(modes.MODES)
    assert [m for m in modes.MODES if modes.reads(m, "batch")] == [
        "mtrm",
        "single_tower",
        "offline",
        "offline_then_online",
    ]
    assert [m for m in modes.MODES if modes.reads(m, "stream")] == [
        "mtrm",
        "single_tower",
        "online",
        "offline_then_online",
    ]
    assert [m for m in modes.MODES if modes.two_towers(m)] == ["mtrm"]
    with pytest.raises(ValueError, match="expected one of"):
        modes.reads("hybrid", "batch")


@pytest.mark.parametrize("mode", ["mtrm", "offline", "offline_then_online"])
def test_eval_runs_the_trainer_loop(tiny, monkeypatch, mode):
    """Every training step of a backtest run goes through loop.Trainer, batch windows come through
    the committed-window feed (BatchFeed) in time order, the last one the last hour's t - lag
    (offline_then_online: the last one before its switch - lag)."""
    from datetime import timedelta
    from pathlib import Path

    from primus_lib.evaluation.backtest import load_timeline, run_one
    from primus_lib.train.runtime.feeds import BatchFeed
    from primus_lib.train.runtime.loop import Trainer

    _, job = tiny
    data = Path(job.spec.dataset.streams[1].sources[0].uri.removeprefix("file://")).parent.parent
    timeline = load_timeline(job, data, START, START + timedelta(hours=6), START + timedelta(hours=3))
    steps, reads = [], []
    train_one, read = Trainer.train_one, BatchFeed.read

    def counted(self):
        stepped = train_one(self)
        steps.append(stepped)
        return stepped

    def gated(self, gate, admit):
        table = read(self, gate, admit)
        if table is not None and table.num_rows:
            reads.append(self.windows[self.seq].window)
        return table

    monkeypatch.setattr(Trainer, "train_one", counted)
    monkeypatch.setattr(BatchFeed, "read", gated)
    result = run_one(job, timeline, RunConfig.parse(mode), 0)
    assert sum(steps) == sum(result.steps.values()) > 0
    assert reads, "no batch window came through the training queue"
    assert reads == sorted(reads)
    last = {"offline_then_online": 0}.get(mode, 3)  # lag 2 over 6 hours; the switch at hour 2
    assert reads[-1] == f"20261101T0{last}0000Z"
