"""Data executors: batch task runners, the window join/shuffle/shard writer, stream runners.

The names load their module on first use: a data task's process (one per mapped Airflow task)
imports ``execute_task`` without the join, the ledger's SQLAlchemy or the planner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_WHERE = {
    "BatchExecutor": "batch",
    "TaskFailed": "batch",
    "WindowResult": "batch",
    "run_window": "batch",
    "JoinError": "join",
    "join_window": "join",
    "window_seed": "join",
    "WindowNotCommitted": "sink",
    "sink_window": "sink",
    "TaskOutput": "task",
    "execute_task": "task",
    "staging_path": "task",
}

__all__ = [
    "BatchExecutor",
    "JoinError",
    "TaskFailed",
    "TaskOutput",
    "WindowNotCommitted",
    "WindowResult",
    "execute_task",
    "join_window",
    "run_window",
    "sink_window",
    "staging_path",
    "window_seed",
]

if TYPE_CHECKING:
    from primus_lib.data.executor.batch import BatchExecutor, TaskFailed, WindowResult, run_window
    from primus_lib.data.executor.join import JoinError, join_window, window_seed
    from primus_lib.data.executor.sink import WindowNotCommitted, sink_window
    from primus_lib.data.executor.task import TaskOutput, execute_task, staging_path


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
