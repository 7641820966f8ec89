"""Running a benchmark as ``make bench`` does: its own process, its JSON from the last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(name: str, tmp_path: Path, timeout: float, **env: str) -> dict:
    """``bench/NAME.py`` with ``env`` added (its temporary files under ``tmp_path``): the JSON of its
    last line, once it exited 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py")],
        env={**os.environ, **env, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
