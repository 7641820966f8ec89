"""``trainer/progress.json``: what the trainer has consumed, with per-window metrics.

The one module that writes and reads the file. The trainer (rank 0 under torchrun) writes it
after each checkpoint; the Airflow trainer task and its trigger wait on it, and the batch data
tasks' backlog metric counts the windows it does not list yet. Format (docs/contracts.md)::

    {"consumed": {"<stream>/<window-id>": {"samples": int, "auc": float|null,
                  "logloss": float|null, "at": epoch_seconds}},
     "step": int, "stream_position": {...}, "mode": str, "written_at": epoch_seconds}

The file lives where the job's state lives (``JobPaths.progress``, a ``primus_lib.storage``
location): the job directory, or the shared remote root (``s3://``, ``webhdfs://``) so that the
Airflow trainer task, on another host with another private working directory, reads what the
trainer wrote. It is replaced with ``put_atomic``: a reader sees the old document or the new one.

``auc``/``logloss`` are progressive: each row is scored by the graph that trains on it,
just before that minibatch's update (batch rows by the memory tower in MTRM, stream rows by
the adapt tower), against the label the row carried when it was trained.

Light on purpose (no torch, no pyarrow): the triggerer and DAG parsing import it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from primus_lib.storage import Where, locate


class WindowMetrics(Protocol):
    """What a window's entry is made of (``primus_lib.train.model.metrics.WindowStats`` is one)."""

    samples: int

    def auc(self) -> float | None: ...

    def logloss(self) -> float | None: ...


def progress_key(stream: str, window: str) -> str:
    """The ``consumed`` key of one window (``window`` is a window id, ``paths.window_id``)."""
    return f"{stream}/{window}"


def window_summary(stats: WindowMetrics) -> dict[str, Any]:
    """One ``consumed`` entry: the window's samples and progressive AUC/logloss, stamped now."""
    return {"samples": stats.samples, "auc": stats.auc(), "logloss": stats.logloss(), "at": time.time()}


def write_progress(path: Where, consumed: dict, step: int, stream_position: dict, mode: str) -> None:
    """Replace the file atomically: a reader never sees half of it."""
    document = {
        "consumed": consumed,
        "step": step,
        "stream_position": stream_position,
        "mode": mode,
        "written_at": time.time(),
    }
    locate(path).put_atomic(json.dumps(document, indent=1, sort_keys=True).encode("utf-8"))


def read_progress(path: Where) -> dict[str, Any]:
    """The document, or ``{"consumed": {}}`` before the trainer's first checkpoint (a location, a
    path, or its URI as ``str(JobPaths.progress)`` gives it)."""
    try:
        text = locate(path).read_text()
    except FileNotFoundError:
        return {"consumed": {}}
    document = json.loads(text)
    if not isinstance(document, dict) or not isinstance(document.get("consumed", {}), dict):
        raise ValueError(f"{path}: expected an object with a 'consumed' mapping")
    document.setdefault("consumed", {})
    return document


def consumed_metrics(progress: dict[str, Any], keys: list[str]) -> dict[str, Any] | None:
    """Metrics of the windows ``keys`` once all are consumed, else None."""
    consumed = progress.get("consumed", {})
    if not all(key in consumed for key in keys):
        return None
    return {key: consumed[key] for key in keys}


def missing(progress: dict[str, Any], keys: list[str]) -> list[str]:
    """The windows of ``keys`` not consumed yet."""
    consumed = progress.get("consumed", {})
    return [key for key in keys if key not in consumed]


def await_consumed(
    path: Where,
    keys: list[str],
    within: float,
    every: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any] | None:
    """Metrics of the windows ``keys`` once the file lists them all, read every ``every`` seconds
    for at most ``within``; None if they are not all consumed by then.

    The Airflow trainer task waits here before it defers: a caught-up trainer consumes a window
    seconds after its Sink, and a deferral costs at least the trigger's first-check delay."""
    deadline = clock() + within
    while True:
        metrics = consumed_metrics(read_progress(path), keys)
        if metrics is not None:
            return metrics
        left = deadline - clock()
        if left <= 0:
            return None
        sleep(min(every, left))
