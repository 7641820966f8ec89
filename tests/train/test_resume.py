"""Kill -9 a running `primus train`, restart it, and find every sample used exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta

import pyarrow.json as pajson
import pytest

from primus_lib.paths import JobPaths
from primus_lib.train.replay import batch_window
from tests.train.conftest import START, commit_windows


def _consumed(log_text: str) -> tuple[Counter, list[int]]:
    """Sample ids per stream of the steps that a checkpoint covers.

    Each run logs ``run PID resume S`` at start; steps a killed run took after its last
    checkpoint are redone by the next run, so steps > S of earlier runs are dropped.
    """
    runs: list[tuple[int, list[tuple[int, str, list[str]]]]] = []
    for line in log_text.splitlines():
        parts = line.split(" ")
        if parts[0] == "run":
            runs.append((int(parts[3]), []))
        elif parts[0] == "step" and len(parts) == 4:  # a SIGKILL may cut the last line short
            runs[-1][1].append((int(parts[1]), parts[2], parts[3].split(",")))
    counts: Counter = Counter()
    for index, (_, steps) in enumerate(runs):
        limit = runs[index + 1][0] if index + 1 < len(runs) else float("inf")
        for step, stream, ids in steps:
            if step <= limit:
                counts.update((stream, i) for i in ids)
    return counts, [r[0] for r in runs]


def test_kill_and_resume_uses_every_sample_once(tiny, tmp_path):
    spec, job = tiny
    sizes = commit_windows(job, range(6))
    log = tmp_path / "ids.log"
    env = {**os.environ, "PRIMUS_TRAIN_SAMPLE_LOG": str(log), "PRIMUS_TRAIN_STEP_DELAY": "0.05", "OMP_NUM_THREADS": "1"}
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
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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

    env["PRIMUS_TRAIN_STEP_DELAY"] = "0"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    counts, resumed_at = _consumed(log.read_text())
    assert len(resumed_at) == 2 and resumed_at[0] == 0 and resumed_at[1] > 0, resumed_at
    events = pajson.read_json(str(tmp_path / "data" / "stream" / "events.jsonl")).column("request_id").to_pylist()
    batch_ids = []
    for hour in range(6):
        batch_ids += (
            batch_window(job, job.stream("history"), START + timedelta(hours=hour)).column("request_id").to_pylist()
        )
    expected = Counter([("realtime", i) for i in events] + [("history", i) for i in batch_ids])
    assert sum(sizes) == len(batch_ids)
    duplicates = {k: v for k, v in counts.items() if v > 1}
    missing = set(expected) - set(counts)
    assert not duplicates, f"{len(duplicates)} samples trained twice, e.g. {list(duplicates)[:3]}"
    assert not missing, f"{len(missing)} samples never trained, e.g. {list(missing)[:3]}"
    assert counts == expected

    progress = json.loads(JobPaths.for_job(job).progress.read_text())
    windows = {k: v for k, v in progress["consumed"].items() if k.startswith("history/")}
    assert [v["samples"] for _, v in sorted(windows.items())] == sizes  # stats survived the kill exactly once too
    assert all(0.0 <= v["auc"] <= 1.0 and v["logloss"] > 0 for v in windows.values())


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
