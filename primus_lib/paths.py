"""Where a job keeps its state on the embedded default: one directory per job.

Layout under ``JobPaths.root``::

    ledger.sqlite                      data tasks and the training queue (data driver), unless
                                       spec.storage.database names a PostgreSQL database
    windows/<stream>/<window-id>/      committed shards of one window: manifest.json + part-*.arrow
    trainer/progress.json              what the trainer consumed, with per-window metrics
    trainer/checkpoints/               model + optimizer + data position
    metrics/                           metric snapshots of executors and trainers

``JobPaths.state`` is where the job's shared state lives (windows, staging, checkpoints, metric
snapshots, progress.json, scaling state, the executors' registry): a ``primus_lib.storage``
location, the same kind of object whether the root is a local directory or remote. When
``spec.storage.root`` is remote (``s3://`` or ``webhdfs://``) that is the root plus the job's name
(``JobPaths.shared``), and what cannot be shared (the SQLite ledger when no database is named, the
local backend's process table) stays in a private local working directory, ``JobPaths.root``:
``$PRIMUS_HOME/jobs/<job>`` (else ``.primus/jobs/<job>``).

The remote root is read with the credentials of ``spec.storage.connection_id`` and the database
with the login of ``spec.storage.database_connection_id``, both resolved here through
``primus_lib.credentials`` (the secret files of a role, the Airflow connections of a task).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from primus_lib.credentials import CredentialsError, current
from primus_lib.settings import settings
from primus_lib.spec.job import PrimusJob
from primus_lib.storage import StorageLocation, Where, local_directory, locate, unresolved

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from primus_lib.credentials import StorageCredentials

WINDOW_ID_FORMAT = "%Y%m%dT%H%M%SZ"
SQLITE_LEDGER = "ledger.sqlite"  # under the job's root, when the spec names no database


def window_id(start: datetime) -> str:
    """A window's name: its start instant in UTC, sortable as text."""
    return start.astimezone(UTC).strftime(WINDOW_ID_FORMAT)


def parse_window_id(text: str) -> datetime:
    return datetime.strptime(text, WINDOW_ID_FORMAT).replace(tzinfo=UTC)


def _local_jobs_root() -> Path:
    return (settings().home / "jobs").absolute()


def jobs_root(job: PrimusJob) -> Path:
    """The local directory of the jobs: spec.storage.root when it is local, else the private
    working directory next to a remote root."""
    return local_directory(job.spec.storage.root) or _local_jobs_root()


@dataclass(frozen=True)
class JobPaths:
    root: Path  # local: the job's directory; with a remote storage root, its private working directory
    database: str | None = field(default=None, repr=False)  # spec.storage.database: holds a password
    shared: StorageLocation | None = None  # the job's directory on a remote root (s3://, webhdfs://)
    database_connection_id: str | None = None  # its login completes ``database`` (resolved when read)
    credentials: StorageCredentials | None = field(default=None, repr=False)  # the remote root's

    @classmethod
    def for_job(cls, job: PrimusJob) -> JobPaths:
        storage = job.spec.storage
        shared, credentials = None, None
        if storage.root is not None and local_directory(storage.root) is None:
            try:
                credentials = current().storage(storage.connection_id, "spec.storage.connection_id")
            except CredentialsError as exc:  # paths are still computed; the store's first use says why
                shared = unresolved(storage.root, exc) / job.name
            else:
                shared = locate(storage.root, credentials) / job.name
        return cls(jobs_root(job) / job.name, storage.database, shared, storage.database_connection_id, credentials)

    def locate(self, uri: Where) -> StorageLocation:
        """A location the job recorded by URI (a window's path in the training queue), read with
        the store's credentials (``spec.storage.connection_id``), not the process's default ones."""
        return locate(uri, self.credentials)

    @property
    def state(self) -> StorageLocation:
        """Where the job's shared state lives: the remote root's job directory, else the local root."""
        return self.shared if self.shared is not None else locate(self.root)

    @property
    def ledger(self) -> Path | URL:
        """Where the task ledger and the training queue live: the PostgreSQL database the spec
        names (a SQLAlchemy URL, whose str and repr mask the password), else the job's SQLite file."""
        if self.database:
            from sqlalchemy.engine import make_url  # only jobs with a database pay for the import

            url = make_url(self.database)
            if self.database_connection_id:  # the connection's login completes the URL
                where = "spec.storage.database_connection_id"
                conn = current().connection(self.database_connection_id, where)
                url = url.set(username=conn.login or url.username, password=conn.password or url.password)
            return url
        return self.root / SQLITE_LEDGER

    @property
    def sqlite_ledger(self) -> Path | None:
        """The job's SQLite ledger file (its size and mtime tell when it changed); None with a database."""
        return None if self.database else self.root / SQLITE_LEDGER

    def window_dir(self, stream: str, start: datetime) -> StorageLocation:
        return self.state / "windows" / stream / window_id(start)

    @property
    def trainer_dir(self) -> Path:
        return self.root / "trainer"

    @property
    def progress(self) -> StorageLocation:
        """The trainer's progress.json, next to its checkpoints: the Airflow trainer task reads it
        from wherever it runs (``primus_lib.progress``)."""
        return self.state / "trainer" / "progress.json"

    @property
    def checkpoints(self) -> StorageLocation:
        return self.state / "trainer" / "checkpoints"

    @property
    def metrics_dir(self) -> StorageLocation:
        return self.state / "metrics"
