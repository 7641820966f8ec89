"""primus_lib.progress: trainer/progress.json, written atomically, read by the trigger and metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from primus_lib.progress import (
    await_consumed,
    consumed_metrics,
    missing,
    progress_key,
    read_progress,
    window_summary,
    write_progress,
)
from primus_lib.train.model.metrics import WindowStats


def test_written_then_read_back(tmp_path):
    path = tmp_path / "trainer" / "progress.json"
    stats = WindowStats()
    stats.add(np.array([1.0, 0.0, 1.0, 0.0]), np.array([0.9, 0.2, 0.7, 0.4]))
    key = progress_key("history", "20261101T000000Z")
    write_progress(path, {key: window_summary(stats)}, step=7, stream_position={"realtime": []}, mode="mtrm")
    document = read_progress(path)
    assert key == "history/20261101T000000Z"
    assert document["step"] == 7 and document["mode"] == "mtrm" and document["stream_position"] == {"realtime": []}
    entry = document["consumed"][key]
    assert entry["samples"] == 4 and entry["auc"] == 1.0 and entry["logloss"] > 0 and entry["at"] > 0
    assert [p.name for p in path.parent.iterdir()] == ["progress.json"]  # no temp file left


def test_before_the_first_checkpoint_nothing_is_consumed(tmp_path):
    document = read_progress(tmp_path / "progress.json")
    assert document == {"consumed": {}}
    assert consumed_metrics(document, ["a/1"]) is None and missing(document, ["a/1"]) == ["a/1"]


def test_consumed_metrics_only_once_every_window_is_there():
    document = {"consumed": {"a/1": {"samples": 3}, "b/1": {"samples": 4}}}
    assert consumed_metrics(document, ["a/1"]) == {"a/1": {"samples": 3}}
    assert consumed_metrics(document, ["a/1", "a/2"]) is None
    assert missing(document, ["a/1", "a/2", "b/1"]) == ["a/2"]


def test_a_file_that_is_not_a_progress_document_is_refused(tmp_path):
    path = tmp_path / "progress.json"
    path.write_text(json.dumps({"consumed": [1, 2]}))
    with pytest.raises(ValueError, match="expected an object with a 'consumed' mapping"):
        read_progress(path)


class _Trainer:
    """A clock the wait sleeps on; the trainer writes its checkpoint's progress when it reaches ``at``."""

    def __init__(self, path, at: float | None):
        self.path, self.at, self.now = path, at, 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds
        if self.at is not None and self.now >= self.at and not self.path.exists():
            entry = {"samples": 5, "auc": 0.6, "logloss": 0.4, "at": self.now}
            write_progress(self.path, {"history/w1": entry}, step=3, stream_position={}, mode="mtrm")


def test_the_train_task_waits_for_a_window_the_trainer_is_about_to_consume(tmp_path):
    trainer = _Trainer(tmp_path / "progress.json", at=2.2)
    got = await_consumed(trainer.path, ["history/w1"], 15.0, 0.5, trainer.clock, trainer.sleep)
    assert got is not None and got["history/w1"]["samples"] == 5
    assert trainer.now == 2.5  # seen at the first read after it was written, not at the end of the wait


def test_the_wait_gives_up_at_its_bound_and_reads_once_without_one(tmp_path):
    trainer = _Trainer(tmp_path / "progress.json", at=None)
    assert await_consumed(trainer.path, ["history/w1"], 3.2, 0.5, trainer.clock, trainer.sleep) is None
    assert trainer.now == 3.2  # the last sleep is cut to the bound
    late = _Trainer(tmp_path / "late.json", at=0.1)
    assert await_consumed(late.path, ["history/w1"], 0.0, 0.5, late.clock, late.sleep) is None
    assert late.now == 0.0  # within 0: one read, no sleep
