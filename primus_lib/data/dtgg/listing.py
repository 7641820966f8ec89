"""Fused scans: one listing of a shared storage prefix serves many (source, window) partitions.

A naive planner lists every partition directory of every source for every window (plus a
request per success marker). Here the partition directories wanted by all sources and windows
of a planning chunk are grouped by filesystem; from their common parent down, subtrees no
wanted partition lies under are pruned (a non-recursive listing per level), and each directory
that holds wanted partitions is listed once, recursively, the walks running concurrently; the
files are bucketed by directory. WebHDFS has no recursive listing: there each wanted
directory is listed once, the requests pipelined on a few connections (``webhdfs.py``). (The
cache of generated task lists is the ledger: a planned window is never listed again.)

The lister is also the only way the naive planner reaches storage (``list_dir``, ``is_file``:
one request each), so the two planners differ in what they ask, not in the client that asks.
"""

from __future__ import annotations

import bisect
import builtins  # in FusedLister, `list` in an annotation names its method list()
import contextlib
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
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

    def __init__(self, threads: int = 4, max_levels: int = 6):
        self.threads = max(1, threads)
        self.max_levels = max_levels  # directory levels pruned above the partitions at most
        self.requests = 0
        self._lock = threading.Lock()
        self._hdfs_listers: dict[int, object] = {}
        self._pool: ThreadPoolExecutor | None = None

    @contextlib.contextmanager
    def shared_pool(self) -> Iterator[None]:
        """Listings made inside share one pool of ``threads`` workers, so several can be in flight (the
        planner lists chunks ahead) while their requests together stay within ``threads``, and the
        workers' kept-alive connections serve every chunk. Outside it, each listing has its own."""
        if self.threads == 1 or self._pool is not None:
            yield
            return
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="dtgg-list")
        try:
            yield
        finally:
            pool, self._pool = self._pool, None
            pool.shutdown(cancel_futures=True)

    def list(self, fs: pafs.FileSystem, wanted: set[str]) -> Listing:
        """Files of every directory in ``wanted`` (paths ending in ``/``) that exists."""
        listing = Listing()
        if not wanted:
            return listing
        targets = sorted(wanted)
        hdfs = self._webhdfs(fs)
        if hdfs is not None:  # no recursive listing over WebHDFS: one request per partition
            return self._list_each(hdfs, targets, listing)
        frontier = self._frontier(fs, _common_dir(targets), targets, wanted)
        for found in self._map(lambda d: self._walk(fs, d), frontier):
            for directory, entries in found.items():
                listing.dirs[directory].extend(entries)
        listing.requests = self.requests
        return listing

    def list_dir(self, fs: pafs.FileSystem, directory: str) -> builtins.list[FileEntry] | None:
        """The files directly in one directory (one listing request); None when it has none or
        does not exist, as in a fused listing (WebHDFS: [] for an existing empty directory)."""
        hdfs = self._webhdfs(fs)
        with self._lock:
            self.requests += 1
        if hdfs is not None:
            return hdfs.list_dir(directory)
        selector = pafs.FileSelector(directory.rstrip("/") or "/", allow_not_found=True)
        found = [FileEntry(i.base_name, i.size or 0) for i in fs.get_file_info(selector) if i.is_file]
        return found or None

    def is_file(self, fs: pafs.FileSystem, path: str) -> bool:
        """Whether ``path`` is a file (one status request: a success-marker check)."""
        hdfs = self._webhdfs(fs)
        with self._lock:
            self.requests += 1
        if hdfs is not None:
            return hdfs.is_file(path)
        return fs.get_file_info(path).type == pafs.FileType.File

    def _webhdfs(self, fs):
        from primus_lib.data.dtgg.webhdfs import WebHdfsLister, webhdfs_client

        client = webhdfs_client(fs)
        if client is None:
            return None
        with self._lock:  # chunks listed ahead ask from several threads: one lister (its connections) for all
            lister = self._hdfs_listers.get(id(client))
            if lister is None:
                lister = self._hdfs_listers[id(client)] = WebHdfsLister(client)
        return lister

    def _list_each(self, hdfs, targets: builtins.list[str], listing: Listing) -> Listing:
        """Each wanted directory listed once: ``threads`` connections, each pipelining a
        contiguous share of the directories; absent ones stay absent."""
        with self._lock:
            self.requests += len(targets)
        n = min(self.threads, len(targets))
        shares = [targets[i * len(targets) // n : (i + 1) * len(targets) // n] for i in range(n)]
        for found in self._map(hdfs.list_dirs, shares):
            for directory, entries in found.items():
                if entries is not None:
                    listing.dirs[directory].extend(entries)
        listing.requests = self.requests
        return listing

    def _frontier(self, fs, root: str, targets: builtins.list[str], wanted: set[str]) -> builtins.list[str]:
        """The directories to walk: from ``root`` down, non-recursive listings (one request per
        directory) prune every subtree no wanted partition lies under, until each directory left
        is a wanted partition or holds one directly. Subtrees of old or future partitions are
        never listed, and a directory's partitions are still listed together in one walk."""
        final: list[str] = []
        todo = [root]
        for _ in range(self.max_levels):
            if not todo:
                break
            deeper: list[str] = []
            above: list[str] = []
            for directory in todo:
                held = directory in wanted or _holds_wanted(targets, directory)
                (final if held else above).append(directory)
            for infos in self._map(lambda d: self._ls(fs, d, recursive=False), above):
                for info in infos:
                    if not info.is_file:
                        child = info.path.rstrip("/") + "/"
                        if _has_prefix(targets, child):
                            deeper.append(child)
            todo = deeper
        return final + todo

    def _map(self, call: Callable, items: builtins.list) -> Iterable:
        """``call`` over ``items``: on the shared pool (a single item too: the listings in flight then
        make at most ``threads`` requests at once), else on a pool of this listing's own (one item,
        or one thread: here)."""
        if self._pool is not None:
            return self._pool.map(call, items)
        if len(items) <= 1 or self.threads == 1:
            return [call(item) for item in items]
        with ThreadPoolExecutor(min(self.threads, len(items)), thread_name_prefix="dtgg-list") as pool:
            return builtins.list(pool.map(call, items))

    def _walk(self, fs, directory: str) -> dict[str, builtins.list[FileEntry]]:
        out: dict[str, list[FileEntry]] = defaultdict(list)
        entry = FileEntry
        for info in self._ls(fs, directory, recursive=True):
            if info.is_file:
                parent, _, name = info.path.rpartition("/")
                out[parent + "/"].append(entry(name, info.size or 0))
        return out

    def _ls(self, fs, directory: str, recursive: bool) -> builtins.list[pafs.FileInfo]:
        with self._lock:
            self.requests += 1
        selector = pafs.FileSelector(directory.rstrip("/") or "/", allow_not_found=True, recursive=recursive)
        return fs.get_file_info(selector)


def _common_dir(paths: list[str]) -> str:
    prefix = os.path.commonprefix(paths)
    return prefix[: prefix.rfind("/") + 1]


def _holds_wanted(sorted_paths: list[str], directory: str) -> bool:
    """Whether a wanted path lies directly in ``directory`` (one level down)."""
    i = bisect.bisect_left(sorted_paths, directory)
    while i < len(sorted_paths) and sorted_paths[i].startswith(directory):
        if "/" not in sorted_paths[i][len(directory) : -1]:
            return True
        i += 1
    return False


def _has_prefix(sorted_paths: list[str], prefix: str) -> bool:
    i = bisect.bisect_left(sorted_paths, prefix)
    return i < len(sorted_paths) and sorted_paths[i].startswith(prefix)
