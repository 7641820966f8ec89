"""``trainer/progress.json``: what the trainer has consumed (polled by the Airflow trigger).

Format (docs/contracts.md)::

    {"consumed": {"<stream>/<window-id>": {"samples": int, "auc": float|null,
                  "logloss": float|null, "at": epoch_seconds}},
     "step": int, "stream_position": {...}, "mode": str}

``auc``/``logloss`` are progressive: each row is scored by the graph that trains on it,
just before that minibatch's update (batch rows by the memory tower in MTRM, stream rows by
the adapt tower), against the label the row carried when it was trained.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from primus_lib.train.metrics import WindowStats


def progress_document(consumed: dict, step: int, stream_position: dict, mode: str) -> str:
    return json.dumps(
        {
            "consumed": consumed,
            "step": step,
            "stream_position": stream_position,
            "mode": mode,
            "written_at": time.time(),
        },
        indent=1,
        sort_keys=True,
    )


def window_summary(stats: WindowStats) -> dict:
    """One ``consumed`` entry: the window's samples and progressive AUC/logloss, stamped now."""
    return {"samples": stats.samples, "auc": stats.auc(), "logloss": stats.logloss(), "at": time.time()}


def read_progress(path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
