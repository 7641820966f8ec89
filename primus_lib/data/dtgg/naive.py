"""The baseline planner the benchmark compares DTGG with: per window, per source, check the
success marker and list the partition directory; one thread, no fusing, no cache. It yields the
same tasks as DTGG (the tests check that), so only the planning cost differs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow.fs as pafs

from primus_lib.data.dtgg import timer
from primus_lib.data.dtgg.listing import FileEntry, Listing
from primus_lib.data.dtgg.ops import DataSourceOp, JoinerOp, PartitionNotReady, WindowPlan
from primus_lib.spec.job import PrimusJob


def naive_plan(
    job: PrimusJob, stream: str, start: datetime | None = None, end: datetime | None = None
) -> Iterator[WindowPlan]:
    spec = job.stream(stream)
    ops = [DataSourceOp(job, spec, s) for s in spec.sources]
    joiner = JoinerOp(spec)
    now = datetime.now(UTC)
    for window in timer.windows(job, start, end):
        results = []
        for op in ops:
            part = op.partition(window)
            fs = op.location.fs
            entries: list[FileEntry] | None = None
            if part.marker_path is None or fs.get_file_info(part.marker_path).type == pafs.FileType.File:
                infos = fs.get_file_info(pafs.FileSelector(part.directory.rstrip("/"), allow_not_found=True))
                entries = [FileEntry(i.base_name, i.size or 0) for i in infos if i.type == pafs.FileType.File]
                if part.marker is not None:
                    entries.append(FileEntry(part.marker, 0))
            listing = Listing()
            if entries is not None:
                listing.dirs[part.directory] = entries
            results.append(op.run(window, listing, now))
        plan = joiner.join(window, results)
        if not plan.ready:
            raise PartitionNotReady("; ".join(plan.missing))
        yield plan
