"""The DTGG planner: Timer -> DataSource ops (fed by fused scans) -> Joiner -> Sink, per chunk.

Windows are planned in chunks: one fused listing per filesystem serves every (source, window)
of the chunk, the DataSource/Joiner work of the chunk's windows runs on a thread pool, and the
Sinks run in window order. With more than one thread the next ``LISTED_AHEAD`` chunks are listed
while this one's tasks are generated, their requests sharing one pool of listing workers: a
remote store's latency hides behind the generation and behind the other chunks' listings (a
chunk's listing is a short chain of dependent requests, which one chunk alone leaves most
workers idle through). ``threads`` (default 16; ``primus plan --threads``) bounds the listing
workers and the generation pool; the plan does not depend on it.
Windows already in the ledger are served from it (cached task lists): a restarted planner does
no listing for them.
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from primus_lib.data.dtgg import timer
from primus_lib.data.dtgg.listing import FusedLister, Listing
from primus_lib.data.dtgg.ops import DataSourceOp, JoinerOp, PartitionNotReady, SinkOp, WindowPlan
from primus_lib.data.ledger import TaskLedger
from primus_lib.filesystems import StorageCredentials
from primus_lib.paths import JobPaths, window_id
from primus_lib.spec.job import PrimusJob

# listing/generation concurrency when the caller gives none (primus plan --threads): a remote store's
# latency divides by the connections (bench/dtgg.py: 4 / 16 / 64 threads at 10 ms a request)
DEFAULT_THREADS = 16
LISTED_AHEAD = 2  # chunks listed ahead of the one being generated (their listings held in memory)


class Planner:
    """Plans the batch windows of one job's stream into the ledger (the data task queue).

    ``credentials``: storage credentials by connection id, resolved by the caller; a source whose
    ``connection_id`` is among them is read with those (else with the connections of ``primus_lib.credentials``).
    """

    def __init__(
        self,
        job: PrimusJob,
        stream: str,
        *,
        threads: int | None = None,
        ledger: TaskLedger | None | bool = True,
        now: datetime | None = None,
        chunk_windows: int | None = None,
        credentials: Mapping[str, StorageCredentials] | None = None,
    ):
        self.job = job
        self.stream = job.stream(stream)
        if self.stream.kind != "batch":
            raise ValueError(f"stream {stream!r} is a {self.stream.kind} stream; DTGG plans batch streams")
        self.threads = max(1, threads if threads is not None else DEFAULT_THREADS)
        self.ledger = TaskLedger(JobPaths.for_job(job).ledger) if ledger is True else (ledger or None)
        self.now = now
        # default: two weeks of windows per fused scan (336 hourly or 14 daily windows)
        self.chunk_windows = chunk_windows or max(1, int(timedelta(days=14) / job.spec.timer.window_size))
        given = credentials or {}
        self.ops = [DataSourceOp(job, self.stream, s, given.get(s.connection_id or "")) for s in self.stream.sources]
        self.joiner = JoinerOp(self.stream)
        self.lister = FusedLister(threads=self.threads)
        self.stats = {"windows_cached": 0, "windows_planned": 0, "tasks": 0}

    @property
    def listings(self) -> int:
        """Listing requests issued so far (the cost fused scans cut)."""
        return self.lister.requests

    def plan(
        self, start: datetime | None = None, end: datetime | None = None, *, strict: bool = True
    ) -> Iterator[WindowPlan]:
        """Plans in time order. At the first window that is not ready: raise (strict) or yield it and stop."""
        sink = SinkOp(self.ledger)
        windows = timer.windows(self.job, start, end)
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="dtgg") if self.threads > 1 else None
        ahead = ThreadPoolExecutor(LISTED_AHEAD, thread_name_prefix="dtgg-ahead") if pool is not None else None
        # listings ahead use the lister's shared pool: it closes after ``ahead`` has finished them
        with self.lister.shared_pool():
            try:
                for chunk, cached, listing in self._listed_chunks(windows, ahead):
                    plans = self._generate(chunk, cached, listing, pool)
                    ready = list(itertools.takewhile(lambda p: p.ready, plans))
                    sink.push_all(ready)  # in time order, one ledger transaction per chunk
                    for plan in ready:
                        self.stats["tasks"] += len(plan.tasks)
                        yield plan
                    if len(ready) < len(plans):
                        stuck = plans[len(ready)]
                        if strict:
                            raise PartitionNotReady("; ".join(stuck.missing))
                        yield stuck
                        return
            finally:
                for executor in (ahead, pool):
                    if executor is not None:
                        executor.shutdown(cancel_futures=True)

    def plan_window(self, start: datetime) -> WindowPlan:
        """One window (the Airflow DataSource task's unit); stored in the ledger once complete."""
        cached = self._cached([start])
        plan = self._generate([start], cached, self.fused_listing([] if cached else [start]), None)[0]
        if plan.ready and not plan.cached and self.ledger is not None:
            if not self.ledger.add_window(plan.stream, plan.window, plan.tasks):
                # planned concurrently by another task: the ledger's version is the one that counts
                plan = WindowPlan(plan.stream, start, self.ledger.tasks(plan.stream, plan.window), cached=True)
        return plan

    def _listed_chunks(self, windows: Iterator[datetime], ahead: ThreadPoolExecutor | None) -> Iterator[tuple]:
        """(chunk, its windows served from the ledger, the fused listing of the others), in order.
        With ``ahead`` the next ``LISTED_AHEAD`` chunks' listings run while the caller generates this one's tasks."""
        pending: deque[tuple] = deque()
        depth = LISTED_AHEAD if ahead is not None else 0
        while True:
            while len(pending) <= depth and (chunk := list(itertools.islice(windows, self.chunk_windows))):
                cached = self._cached(chunk)
                todo = [s for s in chunk if s not in cached]
                if ahead is None:
                    pending.append((chunk, cached, self.fused_listing(todo)))
                else:
                    pending.append((chunk, cached, ahead.submit(self.fused_listing, todo)))
            if not pending:
                return
            chunk, cached, listing = pending.popleft()
            yield chunk, cached, listing if ahead is None else listing.result()

    def _cached(self, chunk: list[datetime]) -> dict[datetime, WindowPlan]:
        """The chunk's windows already in the ledger (cached task lists)."""
        if self.ledger is None:
            return {}
        done = set(self.ledger.planned_windows(self.stream.name))
        hits = [s for s in chunk if window_id(s) in done]
        found = self.ledger.tasks_by_window(self.stream.name, [window_id(s) for s in hits])
        return {s: WindowPlan(self.stream.name, s, found[window_id(s)], cached=True) for s in hits}

    def _generate(
        self, chunk: list[datetime], cached: dict, listing: Listing, pool: ThreadPoolExecutor | None
    ) -> list[WindowPlan]:
        todo = [s for s in chunk if s not in cached]
        self.stats["windows_cached"] += len(cached)
        self.stats["windows_planned"] += len(todo)
        now = self.now or datetime.now(UTC)

        def generate(start: datetime) -> WindowPlan:
            return self.joiner.join(start, [op.run(start, listing, now) for op in self.ops])

        fresh = list(pool.map(generate, todo)) if pool is not None and len(todo) > 1 else [generate(s) for s in todo]
        planned = dict(zip(todo, fresh, strict=True))
        return [cached.get(s) or planned[s] for s in chunk]

    def fused_listing(self, starts: list[datetime]) -> Listing:
        """One listing per filesystem for all partitions of all sources in ``starts``."""
        groups: dict[tuple, tuple[object, set[str]]] = {}
        for op in self.ops:
            key = (op.location.scheme, op.location.authority, id(op.location.fs))
            entry = groups.setdefault(key, (op.location.fs, set()))
            for start in starts:
                if op.active(start):
                    entry[1].add(op.partition(start).directory)
        merged = Listing(dirs=defaultdict(list))
        for fs, wanted in groups.values():
            part = self.lister.list(fs, wanted)
            for directory, files in part.dirs.items():
                if directory in wanted:
                    merged.dirs[directory] = files
        merged.requests = self.lister.requests
        return merged
