"""scripts/gpu_train_check.py on the CPU: ``primus train`` under torchrun in a world of one with
``sharding: dmp`` builds the sharded model (the one-GPU trainer's path), is killed with SIGKILL
and resumes from its DCP checkpoint with every sample trained exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_rank_dmp_trainer_killed_and_resumed_trains_every_sample_once(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_train_check.py"), "--ranks", "1", "--keep", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["device"] == "cpu" and report["ranks"] == 1
    assert report["checks"] == {
        "exactly_once": True,
        "resumed_from_a_checkpoint": True,
        "windows_trained_whole": True,
        "dcp_file_per_rank": True,  # the sharded model's checkpoint: the world of one took the DMP path
        "trained_on_cuda": None,
    }
    assert report["dcp_files"] == ["__0_0.distcp"] and report["resumed_at"][0][1] > 0
    assert report["final"][0].endswith(", on cpu")  # the trainer names the device it trained on
