"""A process's descendants and resident memory read straight from /proc: a few small reads,
instead of psutil's scan of every process on the host (tens of ms on a busy node, per call).
Without /proc (macOS) psutil answers, as it did before."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
HAS_PROC = Path("/proc/self/task").is_dir()


def descendants(pid: int) -> list[int]:
    """``pid``'s children, grandchildren, ... from /proc/<pid>/task/*/children (not ``pid`` itself)."""
    if not HAS_PROC:
        try:
            return [child.pid for child in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                kids = [int(c) for c in children.read_text().split()]
            except OSError:  # the thread or process ended meanwhile
                continue
            found += kids
            todo += kids
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    return [pid, *descendants(pid)]


def rss(pid: int) -> int:
    """Resident bytes of ``pid`` (0 when it is gone)."""
    if not HAS_PROC:
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return 0
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0
