from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from primus_lib.spec import load_job

ROOT = Path(__file__).resolve().parents[2]


def test_window_of_refuses_a_manual_start_off_the_window_grid():
    from primus_operators._common import window_of

    job = load_job(ROOT / "config/jobs/ctr-demo.yaml", env={"PRIMUS_DATA": "/data"})
    aligned = {"params": {"window_start": "2026-11-01T05:00:00Z"}}
    assert window_of(aligned, job) == datetime(2026, 11, 1, 5, tzinfo=UTC)
    interval = {"params": {}, "data_interval_start": datetime(2026, 11, 1, 6, tzinfo=UTC)}
    assert window_of(interval, job) == datetime(2026, 11, 1, 6, tzinfo=UTC)
    off = {"params": {"window_start": "2026-11-01T05:30:00Z"}}
    with pytest.raises(ValueError, match="window_start: expected the start of a 1h window of job ctr-demo"):
        window_of(off, job)
    assert window_of(off) == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # without a job: no grid to check
