"""Per-window statistics and window completion: which windows the trainer has consumed.

A batch window is consumed when every row of it this process reads is trained (rows are
tagged with their queue seq); a stream window once the trained rows' event time passed its
end. Consumed windows go to progress.json (the Airflow ``train`` task waits on them) and
their statistics into the checkpoint.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from primus_lib.paths import parse_window_id, window_id
from primus_lib.progress import progress_key, window_summary
from primus_lib.timegrid import epoch_ms, from_epoch_ms
from primus_lib.train.model.batch import Cut
from primus_lib.train.model.metrics import WindowStats
from primus_lib.train.runtime.feeds import SEQ_COLUMN, BatchFeed


class WindowAccounting:
    """Statistics of the windows in training and the summaries of those consumed."""

    def __init__(self, window_ms: int, stream_only: bool, keep_raw: bool = False):
        self.window_ms = window_ms
        self.stream_only = stream_only  # checkpoint whenever the stream enters a new window
        self.keep_raw = keep_raw  # data-parallel: raw stats are merged over ranks by rank 0
        self.stats: dict[str, WindowStats] = {}  # "<stream>/<window-id>" -> progressive stats
        self.consumed: dict[str, dict] = {}
        self.seq_rows: dict[int, list] = {}  # batch seq -> [key, expected rows, trained rows]
        self.unmerged: dict[str, dict] = {}  # raw stats of windows this rank finished, not yet merged
        self.done_since_checkpoint = False
        self.stream_window = -1  # newest stream window trained
        self.stream_keys: dict[tuple[str, int], str] = {}

    def expect(self, feed: BatchFeed, seq: int) -> None:
        """A batch window started arriving: how many of its rows this process trains."""
        window = feed.windows.get(seq)
        if window is not None and window.seq not in self.seq_rows:
            rows = feed.expected_rows(window)
            self.seq_rows[window.seq] = [progress_key(window.stream, window.window), rows, 0]
            if rows == 0:
                self.window_done(window.seq)

    def parts(self, kind: str, rows: pa.Table | Cut, ts: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
        """A minibatch's rows by window: (queue seq or stream window number, mask or None for
        all rows). A function of the rows alone, so the prefetch thread computes it ahead."""
        if kind != "batch":
            keys = ts // self.window_ms
        else:  # a cut's column is converted once for its table's minibatches
            keys = rows.view(SEQ_COLUMN) if isinstance(rows, Cut) else rows.column(SEQ_COLUMN).to_numpy()
        first = int(keys[0])
        # a minibatch rarely spans two windows: one statistics update then, no masks
        if (keys == first).all():
            return [(first, None)]
        return [(int(k), keys == k) for k in sorted(set(keys.tolist()))]

    def account(
        self,
        name: str,
        kind: str,
        rows: pa.Table,
        ts: np.ndarray,
        labels,
        probs,
        parts: list[tuple[int, np.ndarray | None]] | None = None,
    ) -> None:
        """One trained minibatch: statistics per window, completion of batch windows
        (``parts``: ``self.parts`` of these rows, when computed ahead)."""
        if parts is None:
            parts = self.parts(kind, rows, ts)
        if kind == "batch":
            for seq, mask in parts:
                entry = self.seq_rows[seq]
                if mask is None:
                    self._stats(entry[0]).add(labels, probs)
                    entry[2] += len(labels)
                else:
                    self._stats(entry[0]).add(labels[mask], probs[mask])
                    entry[2] += int(mask.sum())
                if entry[2] >= entry[1]:
                    self.window_done(seq)
            return
        newest = parts[-1][0]  # ascending
        if self.stream_only and newest > self.stream_window:
            self.done_since_checkpoint |= self.stream_window >= 0
            self.stream_window = newest
        for window, mask in parts:
            if mask is None:
                self._stats(self._stream_key(name, window)).add(labels, probs)
            else:
                self._stats(self._stream_key(name, window)).add(labels[mask], probs[mask])

    def _stream_key(self, name: str, window: int) -> str:
        """``<stream>/<window-id>`` of window number ``window`` (cached: formatting a time every step costs)."""
        key = self.stream_keys.get((name, window))
        if key is None:
            if len(self.stream_keys) > 4096:
                self.stream_keys.clear()
            key = self.stream_keys[(name, window)] = progress_key(
                name, window_id(from_epoch_ms(window * self.window_ms))
            )
        return key

    def _stats(self, key: str) -> WindowStats:
        stats = self.stats.get(key)
        if stats is None:  # not setdefault: it would build (and zero) a WindowStats every step
            stats = self.stats[key] = WindowStats()
        return stats

    def window_done(self, seq: int) -> None:
        key = self.seq_rows.pop(seq)[0]
        self.consume(key, self.stats.pop(key, WindowStats()))
        self.done_since_checkpoint = True

    def consume(self, key: str, stats: WindowStats) -> None:
        self.consumed[key] = window_summary(stats)
        if self.keep_raw:
            self.unmerged[key] = stats.to_dict()

    def close_stream_windows(self, horizons: dict[str, int]) -> None:
        """A stream window is consumed once the trained rows' event time passed its end."""
        for name, horizon in horizons.items():
            for key in [k for k in self.stats if k.startswith(f"{name}/")]:
                start = epoch_ms(parse_window_id(key.split("/", 1)[1]))
                if start + self.window_ms <= horizon:
                    self.consume(key, self.stats.pop(key))

    def state(self) -> dict:
        return {
            "stats": {k: v.to_dict() for k, v in self.stats.items()},
            "consumed": self.consumed,
            "seq_rows": self.seq_rows,
        }

    def load(self, pos: dict, merged: set[str] | None = None) -> None:
        """Restore from a checkpoint position (``merged``: windows rank 0 already summed)."""
        self.stats = {k: WindowStats.from_dict(v) for k, v in pos["stats"].items()}
        self.consumed = pos["consumed"]
        self.seq_rows = {int(k): v for k, v in pos["seq_rows"].items()}
        if merged is not None:
            self.unmerged = {k: v for k, v in pos.get("unmerged", {}).items() if k not in merged}

    def merged(self, keys: list[str]) -> None:
        for key in keys:
            self.unmerged.pop(key, None)
