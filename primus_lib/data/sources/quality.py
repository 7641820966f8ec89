"""Row checks on a batch window once its sources are joined: rows from another time and
repeated samples are dropped and counted, a window with no row of its own time is refused.

Why drop, not fail: a partition holding a few late or early events (event time vs. the hour
the logger flushed) or a sample logged twice (at-least-once shipping: a retried upload) is
ordinary; failing the window would stall the job on it. Training on a row from a later
window would leak the future into progressive validation, and a sample seen twice weighs
double, so neither is kept. The counts go into the window's manifest (``extra["dropped"]``).
Why fail when every row is outside: that is a wrong ``{HH}`` template or a timestamp column
in the wrong unit, not data to train on.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_lib.paths import window_id
from primus_lib.spec.job import PrimusJob
from primus_lib.timegrid import epoch_ms, iso


class WindowDataError(ValueError):
    """A window whose rows cannot be its training data; the message names stream, window, column."""


def clean_window(job: PrimusJob, stream: str, table: pa.Table, start: datetime) -> tuple[pa.Table, dict]:
    """``table`` without rows outside the window and without repeated ids; the counts, if any,
    as ``{"dropped": {"outside_window": n, "duplicate_id": m}}``."""
    dropped: dict[str, int] = {}
    end = start + job.spec.timer.window_size
    column = job.spec.features.timestamp
    if table.num_rows and column in table.column_names:
        ts = table.column(column)
        lo, hi = epoch_ms(start), epoch_ms(end)
        inside = pc.fill_null(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)), False)
        kept = int(pc.sum(inside).as_py() or 0)
        if kept == 0:
            first = ts[0].as_py()
            raise WindowDataError(
                f"stream {stream!r} window {window_id(start)}: all {table.num_rows} rows have {column!r} outside "
                f"[{iso(start)}, {iso(end)}) (first {first} ms): check the source's uri template and "
                "its timestamp column and unit"
            )
        if kept < table.num_rows:
            dropped["outside_window"] = table.num_rows - kept
            table = table.filter(inside)
    key = job.spec.features.id
    if key and table.num_rows and key in table.column_names:
        rows = table.append_column("__row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
        first = rows.group_by(key, use_threads=False).aggregate([("__row", "min")]).column("__row_min")
        if len(first) < table.num_rows:
            dropped["duplicate_id"] = table.num_rows - len(first)
            table = table.take(pc.take(first, pc.sort_indices(first)))
    return table, ({"dropped": dropped} if dropped else {})
