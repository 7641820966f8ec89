"""Fused scans: one listing of a shared storage prefix serves many (source, window) partitions.

A naive planner lists every partition directory of every source for every window (plus a
request per success marker). Here the partition directories wanted by all sources and windows
of a planning chunk are grouped by filesystem; each group's common parent is listed once,
recursively, and the files are bucketed by directory. To list in parallel the common parent is
first expanded a level or two (pruning subtrees no wanted partition lies under) and the
remaining subtrees are listed concurrently. (The cache of generated task lists is the
ledger: a planned window is never listed again.)
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import pyarrow.fs as pafs


class FileEntry(NamedTuple):
    name: str
    size: int


@dataclass
class Listing:
    """Files bucketed by their directory (a path that ends with ``/``)."""

    dirs: dict[str, list[FileEntry]] = field(default_factory=lambda: defaultdict(list))
    requests: int = 0

    def files(self, directory: str) -> list[FileEntry] | None:
        """The directory's files sorted by name, or None if the directory was not seen."""
        found = self.dirs.get(directory)
        return None if found is None else sorted(found)  # (name, size): names are unique in a directory


class FusedLister:
    """Lists the wanted directories of one filesystem with as few listings as the layout allows."""

    def __init__(self, threads: int = 4, fanout_target: int | None = None, max_expand_depth: int = 2):
        self.threads = max(1, threads)
        self.fanout_target = fanout_target or self.threads
        self.max_expand_depth = max_expand_depth
        self.requests = 0
        self._lock = threading.Lock()

    def list(self, fs: pafs.FileSystem, wanted: set[str]) -> Listing:
        """Files of every directory in ``wanted`` (paths ending in ``/``) that exists."""
        listing = Listing()
        if not wanted:
            return listing
        targets = sorted(wanted)
        root = _common_dir(targets)
        frontier = [root]
        # Expanding costs a request per directory: only worth it when there is a lot to list,
        # and never down to the partitions themselves (that would be the naive listing again).
        depth = self.max_expand_depth if self.threads > 1 and len(targets) >= 32 * self.fanout_target else 0
        for _ in range(depth):
            if len(frontier) >= self.fanout_target or all(d in wanted for d in frontier):
                break
            frontier = self._expand(fs, frontier, targets, wanted, listing)
        if len(frontier) == 1 or self.threads == 1:
            results = [self._walk(fs, d) for d in frontier]
        else:
            with ThreadPoolExecutor(self.threads, thread_name_prefix="dtgg-list") as pool:
                results = list(pool.map(lambda d: self._walk(fs, d), frontier))
        for found in results:
            for directory, entries in found.items():
                listing.dirs[directory].extend(entries)
        listing.requests = self.requests
        return listing

    def _expand(self, fs, frontier: list[str], targets: list[str], wanted: set[str], listing: Listing) -> list[str]:
        """One level of non-recursive listings; keep subdirectories some wanted path lies under."""
        out: list[str] = []
        for directory in frontier:
            if directory in wanted:  # a wanted partition is walked whole
                out.append(directory)
                continue
            children = []
            for info in self._ls(fs, directory, recursive=False):
                if not info.is_file:
                    child = info.path.rstrip("/") + "/"
                    if _has_prefix(targets, child):
                        children.append(child)
            if any(c in wanted for c in children):  # one level above the partitions: walk it whole
                out.append(directory)
            else:
                out.extend(children)
        return out

    def _walk(self, fs, directory: str) -> dict[str, list[FileEntry]]:
        out: dict[str, list[FileEntry]] = defaultdict(list)
        entry = FileEntry
        for info in self._ls(fs, directory, recursive=True):
            if info.is_file:
                parent, _, name = info.path.rpartition("/")
                out[parent + "/"].append(entry(name, info.size or 0))
        return out

    def _ls(self, fs, directory: str, recursive: bool) -> list[pafs.FileInfo]:
        with self._lock:
            self.requests += 1
        selector = pafs.FileSelector(directory.rstrip("/") or "/", allow_not_found=True, recursive=recursive)
        return fs.get_file_info(selector)


def _common_dir(paths: list[str]) -> str:
    prefix = os.path.commonprefix(paths)
    return prefix[: prefix.rfind("/") + 1]


def _has_prefix(sorted_paths: list[str], prefix: str) -> bool:
    i = bisect.bisect_left(sorted_paths, prefix)
    return i < len(sorted_paths) and sorted_paths[i].startswith(prefix)
