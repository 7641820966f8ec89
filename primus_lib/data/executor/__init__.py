"""Data executors: batch task runners, the window join/shuffle/shard writer, stream runners."""

from __future__ import annotations

from primus_lib.data.executor.batch import BatchExecutor, TaskFailed, WindowResult, run_window
from primus_lib.data.executor.join import JoinError, join_window, window_seed
from primus_lib.data.executor.sink import WindowNotCommitted, sink_window
from primus_lib.data.executor.task import TaskOutput, execute_task, staging_path

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
