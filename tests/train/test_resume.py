"""Kill -9 a running `primus train`, restart it, and find every sample used exactly once: the
multiset of (stream, id) in the trainer's sample log, split at the checkpoint the successor
resumed from, equals the produced one; the rows the successor trained again are counted apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow.json as pajson
import pytest
import torch

from primus_lib.evaluation.replay import batch_window
from primus_lib.paths import JobPaths
from primus_lib.train.runtime.checkpointing import _copied
from primus_lib.train.runtime.sample_log import read_sample_log
from tests.train.conftest import START, commit_windows


def test_kill_and_resume_uses_every_sample_once(tiny, tmp_path):
    spec, job = tiny
    sizes = commit_windows(job, range(6))
    log = tmp_path / "ids.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "primus_lib.cli.main",
        "train",
        str(spec),
        "--checkpoint-steps",
        "4",
        "--poll-interval",
        "0.05",
        "--idle-exit",
        "5",
        "--sample-log",
        str(log),
    ]
    proc = subprocess.Popen([*cmd, "--step-delay", "0.05"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            steps = log.read_text().count("\nstep ") if log.exists() else 0
            if steps >= 14 and proc.poll() is None:
                break
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    trained = read_sample_log(log.read_text())
    assert len(trained.runs) == 2, trained.resumed_at
    killed, successor = trained.runs
    assert killed.resumed_at == 0 and killed.checkpoints, trained.resumed_at  # checkpoints before the kill
    last_step = max(step for step, _, _ in killed.steps)
    # from the newest durable checkpoint at least (one whose write was in flight may be newer), never past the kill
    assert killed.checkpoints[-1] <= successor.resumed_at <= last_step, (killed.checkpoints, successor.resumed_at)
    produced = _produced(job, tmp_path)
    counts = trained.count(produced)
    print(
        f"\nkill -9 at step {last_step}, last durable checkpoint {killed.checkpoints[-1]}, resumed from "
        f"{successor.resumed_at}: {counts}"
    )
    assert counts.exactly_once, counts  # exactly once in the checkpointed model state
    assert set(trained.raw) == set(produced)  # the raw step log: every sample at least once, nothing else

    progress = json.loads(JobPaths.for_job(job).progress.read_text())
    windows = {k: v for k, v in progress["consumed"].items() if k.startswith("history/")}
    assert [v["samples"] for _, v in sorted(windows.items())] == sizes  # stats survived the kill exactly once too
    assert all(0.0 <= v["auc"] <= 1.0 and v["logloss"] > 0 for v in windows.values())


def _produced(job, root: Path) -> Counter:
    """(stream, id) of every produced sample: the six committed windows and the stream replay."""
    events = pajson.read_json(str(root / "data" / "stream" / "events.jsonl")).column("request_id").to_pylist()
    history = job.stream("history")
    batch = [
        i
        for hour in range(6)
        for i in batch_window(job, history, START + timedelta(hours=hour)).column("request_id").to_pylist()
    ]
    return Counter([("realtime", i) for i in events] + [("history", i) for i in batch])


def test_atomic_write_replaces_whole_and_leaves_no_temp_on_failure(tmp_path):
    from primus_lib.durable import atomic_write

    target = tmp_path / "progress.json"
    atomic_write(target, "first")
    atomic_write(target, "second")
    assert target.read_text() == "second"
    blocked = tmp_path / "blocked"
    (blocked / "inside").mkdir(parents=True)  # a non-empty directory cannot be replaced by a file
    with pytest.raises(OSError):
        atomic_write(blocked, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocked", "progress.json"]


def test_the_writers_copy_of_a_state_is_its_own():
    """The state handed to the checkpoint writer thread does not move on with training: tensors (views of one
    buffer among them), arrays, lists and other values are copied."""
    flat = torch.arange(8.0)
    live = {"tables": {"a": flat[:4], "b": flat[4:]}, "ring": np.arange(3), "groups": [{"lr": 0.1}], "n": 5}
    copied = _copied(live)
    flat.add_(100.0)
    live["ring"][0] = 9
    live["groups"][0]["lr"] = 0.2
    assert copied["tables"]["a"].tolist() == [0.0, 1.0, 2.0, 3.0] and copied["tables"]["b"].tolist() == [4, 5, 6, 7]
    assert copied["ring"].tolist() == [0, 1, 2] and copied["groups"] == [{"lr": 0.1}] and copied["n"] == 5
