"""Where a job keeps its state on the embedded default: one directory per job.

Layout under ``JobPaths.root``::

    ledger.sqlite                      data tasks and the training queue (data driver), unless
                                       spec.storage.database names a PostgreSQL database
    windows/<stream>/<window-id>/      committed shards of one window: manifest.json + part-*.arrow
    trainer/progress.json              what the trainer consumed, with per-window metrics
    trainer/checkpoints/               model + optimizer + data position
    metrics/                           metric snapshots of executors and trainers
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from primus_lib.spec.job import PrimusJob

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

WINDOW_ID_FORMAT = "%Y%m%dT%H%M%SZ"


def window_id(start: datetime) -> str:
    """A window's name: its start instant in UTC, sortable as text."""
    return start.astimezone(UTC).strftime(WINDOW_ID_FORMAT)


def parse_window_id(text: str) -> datetime:
    return datetime.strptime(text, WINDOW_ID_FORMAT).replace(tzinfo=UTC)


def jobs_root(job: PrimusJob) -> Path:
    root = job.spec.storage.root
    if root is None:
        root = os.path.join(os.environ.get("PRIMUS_HOME", ".primus"), "jobs")
    if root.startswith("file://"):
        root = root[len("file://") :]
    if "://" in root:
        raise ValueError(f"spec.storage.root: expected a local path or file:// URI, found {root!r}")
    return Path(root).absolute()


@dataclass(frozen=True)
class JobPaths:
    root: Path
    database: str | None = field(default=None, repr=False)  # spec.storage.database: holds a password

    @classmethod
    def for_job(cls, job: PrimusJob) -> JobPaths:
        return cls(jobs_root(job) / job.name, job.spec.storage.database)

    @property
    def ledger(self) -> Path | URL:
        """Where the task ledger and the training queue live: the PostgreSQL database the spec
        names (a SQLAlchemy URL, whose str and repr mask the password), else the job's SQLite file."""
        if self.database:
            from sqlalchemy.engine import make_url  # only jobs with a database pay for the import

            return make_url(self.database)
        return self.root / "ledger.sqlite"

    def window_dir(self, stream: str, start: datetime) -> Path:
        return self.root / "windows" / stream / window_id(start)

    @property
    def trainer_dir(self) -> Path:
        return self.root / "trainer"

    @property
    def progress(self) -> Path:
        return self.trainer_dir / "progress.json"

    @property
    def checkpoints(self) -> Path:
        return self.trainer_dir / "checkpoints"

    @property
    def metrics_dir(self) -> Path:
        return self.root / "metrics"
