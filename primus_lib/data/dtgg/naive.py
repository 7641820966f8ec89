"""The baseline planner the benchmark compares DTGG with: per window, per source, check the
success marker and list the partition directory; one thread, no fusing, no cache. It reaches
storage through the same client as DTGG (``FusedLister.is_file``/``list_dir``: on WebHDFS the
same kept-alive raw connection), and yields the same tasks (the tests check that), so only the
planning differs: what is asked and how often, not how."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from primus_lib.data.dtgg import timer
from primus_lib.data.dtgg.listing import FusedLister, Listing
from primus_lib.data.dtgg.ops import DataSourceOp, JoinerOp, PartitionNotReady, WindowPlan
from primus_lib.spec.job import PrimusJob


def naive_plan(
    job: PrimusJob,
    stream: str,
    start: datetime | None = None,
    end: datetime | None = None,
    *,
    lister: FusedLister | None = None,
    marker_request: bool = True,
) -> Iterator[WindowPlan]:
    """``lister``: the client to list through (its ``requests`` count them); default a one-thread
    one. ``marker_request=False``: a leaner baseline that takes the marker from the listing (one
    request per partition instead of two)."""
    lister = lister or FusedLister(threads=1)
    spec = job.stream(stream)
    ops = [DataSourceOp(job, spec, s) for s in spec.sources]
    joiner = JoinerOp(spec)
    now = datetime.now(UTC)
    for window in timer.windows(job, start, end):
        results = []
        for op in ops:
            part, fs = op.partition(window), op.location.fs
            listing = Listing()
            if part.marker_path is None or not marker_request or lister.is_file(fs, part.marker_path):
                entries = lister.list_dir(fs, part.directory)
                if entries is not None:
                    listing.dirs[part.directory] = entries
            results.append(op.run(window, listing, now))
        plan = joiner.join(window, results)
        if not plan.ready:
            raise PartitionNotReady("; ".join(plan.missing))
        yield plan
