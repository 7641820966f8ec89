"""primus_lib.train.runtime.sample_log: the counting rule of the exactly-once checks (kept = the steps the
final model state holds, replayed = the steps a successor trained again) and records a kill cut."""

from __future__ import annotations

from collections import Counter

import pytest

from primus_lib.train.runtime.sample_log import SampleLogWriter, read_sample_log, read_sample_logs


def _ids(stream: str, *ids: str) -> Counter:
    return Counter((stream, i) for i in ids)


def test_steps_past_the_checkpoint_a_successor_resumed_from_are_replayed_not_kept(tmp_path):
    path = tmp_path / "ids.log"
    first = SampleLogWriter(path)
    first.started(0)
    first.step(1, "history", ["a", "b"])
    first.step(2, "realtime", ["c"])
    first.checkpoint(2)
    first.step(3, "history", ["d"])  # after the checkpoint: killed here
    second = SampleLogWriter(path)
    second.started(2)
    second.step(3, "history", ["d"])
    second.step(4, "history", ["e"])
    second.checkpoint(4)
    log = read_sample_log(path.read_text())
    assert log.resumed_at == [0, 2] and [r.checkpoints for r in log.runs] == [[2], [4]]
    assert log.kept == _ids("history", "a", "b", "d", "e") + _ids("realtime", "c")
    assert log.replayed == _ids("history", "d")
    assert log.raw == log.kept + _ids("history", "d")
    produced = _ids("history", "a", "b", "d", "e") + _ids("realtime", "c")
    counts = log.count(produced)
    assert counts.exactly_once and (counts.trained, counts.replayed, counts.cut) == (5, 1, 0), counts


def test_a_successor_resuming_from_an_older_checkpoint_replays_the_steps_of_every_run_past_it():
    text = "run 1 resume 0\nstep 1 h a 1\nstep 2 h b 1\nrun 2 resume 2\nstep 3 h c 1\nrun 3 resume 1\nstep 2 h b 1\n"
    text += "step 3 h c 1\n"
    log = read_sample_log(text)
    assert log.kept == _ids("h", "a", "b", "c") and log.replayed == _ids("h", "b", "c")


def test_the_counts_name_lost_twice_and_unknown_rows():
    log = read_sample_log("run 1 resume 0\nstep 1 h a,a,x 3\n")
    counts = log.count(_ids("h", "a", "b"))
    assert (counts.lost, counts.twice, counts.unknown) == (1, 1, 1) and not counts.exactly_once


def test_a_record_cut_by_a_kill_is_counted_apart_and_the_next_run_starts_on_its_own_line(tmp_path):
    path = tmp_path / "ids.log"
    writer = SampleLogWriter(path)
    writer.started(0)
    writer.step(1, "h", ["a"])
    writer.checkpoint(1)
    with open(path, "a") as handle:
        handle.write("step 2 h b,c")  # SIGKILL mid-record: no row count, no newline
    SampleLogWriter(path).started(1)
    SampleLogWriter(path).step(2, "h", ["b", "c"])
    log = read_sample_log(path.read_text())
    assert log.resumed_at == [0, 1]  # the successor's run record is not glued to the cut one
    assert log.runs[0].cut == [2] and log.kept == _ids("h", "a", "b", "c") and not log.replayed
    assert log.count(_ids("h", "a", "b", "c")).cut == 1


def test_a_cut_record_inside_a_checkpoint_the_successor_resumed_from_is_an_error():
    with pytest.raises(ValueError, match="cut short"):
        read_sample_log("run 1 resume 0\nstep 1 h a\nrun 2 resume 1\n")


def test_ranks_write_their_own_logs_and_are_counted_together(tmp_path):
    for rank, ids in enumerate((["a"], ["b"])):
        writer = SampleLogWriter(tmp_path / "ids.log", rank)
        writer.started(0)
        writer.step(1, "h", ids)
    texts = [(tmp_path / f"ids.log.rank{r}").read_text() for r in range(2)]
    assert read_sample_logs(texts).kept == _ids("h", "a", "b")
