"""The Sink's data side: append a committed window to the job's training queue, in time order."""

from __future__ import annotations

from datetime import datetime

from primus_lib.data.shards import read_manifest
from primus_lib.data.training_queue import QueuedWindow, TrainingQueue
from primus_lib.paths import JobPaths, window_id
from primus_lib.spec.job import PrimusJob


class WindowNotCommitted(RuntimeError):
    """The Sink ran before the window's shards were committed."""


def sink_window(job: PrimusJob, stream_name: str, window_start: datetime) -> QueuedWindow:
    """Queue a committed window for training; raises OutOfOrderWindow if a later one is queued."""
    job.stream(stream_name)
    paths = JobPaths.for_job(job)
    directory = paths.window_dir(stream_name, window_start)
    manifest = read_manifest(directory)
    if manifest is None:
        raise WindowNotCommitted(
            f"stream {stream_name!r} window {window_id(window_start)}: no manifest at {directory}; run join_window first"
        )
    return TrainingQueue(paths.ledger).append(stream_name, manifest.window, str(directory), manifest.rows)
