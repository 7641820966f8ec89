"""The job's database: one schema for the task ledger and the training queue, on SQLite (the
embedded default, ``ledger.sqlite`` under the job's root) or PostgreSQL (``spec.storage.database``).

A location is a filesystem path (SQLite) or a SQLAlchemy URL (``postgresql+psycopg2://...``).
One engine per URL per process, cached (keyed by pid: a forked child opens its own connections
and never closes the parent's). SQLite: no pool (a connection per transaction, WAL,
``BEGIN IMMEDIATE`` for writers, as the ledger always did). PostgreSQL: a small pool (connections
are checked out for one transaction only, pinged before reuse), READ COMMITTED; the writers that
need more take row locks (``FOR UPDATE [SKIP LOCKED]``), ``ON CONFLICT`` or a table lock.
Passwords never appear in errors or reprs. A PostgreSQL server that restarts or fails over costs
the callers of ``retried`` operations a wait (bounded: ``RETRY_SECONDS``, 120 s, a library default),
not an error: the whole transaction runs again on a fresh connection. A server never reached by
this process (a wrong URL, nothing listening) fails at once.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar

from sqlalchemy import (
    Column,
    Connection,
    Double,
    Engine,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex, CreateTable
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from primus_lib.spec.job import mask_database_url

Location = Path | str | URL

METADATA = MetaData()

data_windows = Table(
    "data_windows",
    METADATA,
    Column("stream", Text, primary_key=True),
    Column("window", Text, primary_key=True),
    Column("tasks", Integer, nullable=False),
    Column("planned_at", Double, nullable=False),
)
data_tasks = Table(
    "data_tasks",
    METADATA,
    Column("id", Text, primary_key=True),
    Column("stream", Text, nullable=False),
    Column("window", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("body", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("executor", Text),
    Column("error", Text),
    Column("output", Text),
    Column("updated", Double, nullable=False),
    Index("data_tasks_order", "state", "stream", "window", "seq"),
)
data_executors = Table(
    "data_executors",
    METADATA,
    Column("id", Text, primary_key=True),
    Column("heartbeat", Double, nullable=False),
    Column("alive", Integer, nullable=False),
)
stream_tasks = Table(
    "stream_tasks",
    METADATA,
    Column("stream", Text, primary_key=True),
    Column("partition", Text, primary_key=True),
    Column("executor", Text),
    Column("assigned_at", Double),
)
training_queue = Table(
    "training_queue",
    METADATA,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("stream", Text, nullable=False),
    Column("window", Text, nullable=False),
    Column("path", Text, nullable=False),
    Column("rows", Integer, nullable=False),
    Column("committed_at", Double, nullable=False),
    UniqueConstraint("stream", "window"),
    sqlite_autoincrement=True,
)

_SCHEMA_LOCK = 0x5052494D5553  # pg_advisory_xact_lock key: one schema creator at a time ("PRIMUS")
_ENGINES: dict[tuple[int, str], Engine] = {}
_SCHEMA_READY: set[tuple[int, str]] = set()
_REACHED: set[int] = set()  # id() of the PostgreSQL engines that have connected once
_LOCK = threading.Lock()


log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


class DatabaseError(RuntimeError):
    """The job's database cannot be reached or used; the message names it without its password.
    ``transient``: a PostgreSQL server this process was connected to refused a new connection
    (restarting, failing over)."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


RETRY_SECONDS = 120.0  # how long an operation waits out a lost database (tests shorten it in-process)


def retry_seconds() -> float:
    return RETRY_SECONDS


def _lost_connection(exc: BaseException) -> bool:
    """A connection that could not be made or was lost (a server restart): worth a new attempt.
    SQLite's errors (locked, no such table) are not: they are answers, not outages."""
    if isinstance(exc, DatabaseError):
        return exc.transient
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def retried(operation: Callable[P, R]) -> Callable[P, R]:
    """Run ``operation`` (one or more whole transactions) again while the database connection is
    lost, for up to ``retry_seconds()``; then a DatabaseError naming the outage. Only for
    operations that are safe to repeat (they check the state they change)."""

    @functools.wraps(operation)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = retry_seconds()
        retrying = Retrying(
            retry=retry_if_exception(_lost_connection),
            stop=stop_after_delay(bound),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            before_sleep=lambda state: log.warning(
                "database connection lost (%s), attempt %d; retrying",
                _first_line(state.outcome.exception() if state.outcome is not None else None),
                state.attempt_number,
            ),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return operation(*args, **kwargs)
        except (DatabaseError, DBAPIError) as exc:
            if not _lost_connection(exc):
                raise
            raise DatabaseError(
                f"the database stayed unreachable for {bound:.0f}s (the retry bound): {_first_line(exc)}"
            ) from None
        raise AssertionError("unreachable: tenacity re-raises the last error")

    return run


_RESTARTING = ("connection refused", "the database system is")  # ... starting up, shutting down, in recovery


def _restarting(exc: BaseException) -> bool:
    """A server that is down or restarting, by psycopg2's message (no SQLSTATE before a session)."""
    return any(sign in str(getattr(exc, "orig", exc)).lower() for sign in _RESTARTING)


def _first_line(exc: BaseException | None) -> str:
    orig = getattr(exc, "orig", None) or exc
    return mask_database_url(str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__)


def database_url(location: Location) -> URL:
    """A path -> the SQLite URL of that file; a URL string -> the parsed URL."""
    if isinstance(location, URL):
        return location
    if "://" not in str(location):  # a path: a SQLite file
        return URL.create("sqlite", database=str(Path(location).absolute()))
    try:
        return make_url(str(location))
    except (ArgumentError, ValueError) as exc:
        raise DatabaseError(f"cannot parse the database URL {mask_database_url(str(location))}: {exc}") from None


def as_location(location: Location) -> Path | URL:
    """A SQLite path as a Path, anything else as a parsed URL (whose str and repr mask the password)."""
    if isinstance(location, URL) or "://" in str(location):
        return database_url(location)
    return Path(location)


def describe(url: URL) -> str:
    """The URL for messages: password masked (user info and query parameters)."""
    return mask_database_url(url.render_as_string(hide_password=True))


def shown(location: Path | URL) -> str:
    """A location for reprs and messages: a path as is, a URL with its password masked."""
    return describe(location) if isinstance(location, URL) else str(location)


def is_postgres(url_or_conn: URL | Connection) -> bool:
    if isinstance(url_or_conn, URL):
        return url_or_conn.get_backend_name() == "postgresql"
    return url_or_conn.dialect.name == "postgresql"


def engine_for(location: Location) -> Engine:
    """The process's engine for ``location`` (created once; a forked child makes its own)."""
    url = database_url(location)
    key = (os.getpid(), url.render_as_string(hide_password=False))
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = _create_engine(url)
    return engine


def dispose(location: Location) -> None:
    """Close the process's pooled connections to ``location`` and forget its engine (tests that
    drop databases, a process done with a job)."""
    url = database_url(location)
    key = (os.getpid(), url.render_as_string(hide_password=False))
    with _LOCK:
        engine = _ENGINES.pop(key, None)
        _SCHEMA_READY.discard(key)
    if engine is not None:
        _REACHED.discard(id(engine))
        engine.dispose()


def _create_engine(url: URL) -> Engine:
    backend = url.get_backend_name()
    if backend == "sqlite":
        Path(url.database or "").parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_connect)
        return engine
    if backend != "postgresql":
        raise DatabaseError(f"unsupported database {describe(url)}: expected SQLite or PostgreSQL")
    return create_engine(
        url,
        pool_size=2,  # idle connections kept per process; executors' threads may open up to 8 more
        max_overflow=8,
        pool_timeout=60,
        pool_pre_ping=True,  # a server restart or an idle timeout costs a reconnect, not an error
        pool_recycle=600,
        connect_args={"connect_timeout": 10, "application_name": "primus"},
    )


def _sqlite_connect(dbapi_connection, _record) -> None:
    dbapi_connection.isolation_level = None  # transactions are ours: BEGIN [IMMEDIATE] ... COMMIT
    dbapi_connection.execute("PRAGMA journal_mode=WAL")
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")


@retried
def open_database(location: Location) -> Engine:
    """The engine of ``location``, with the ledger's and the queue's tables in place."""
    engine = engine_for(location)
    key = (os.getpid(), engine.url.render_as_string(hide_password=False))
    if key in _SCHEMA_READY:
        return engine
    with transaction(engine) as conn:
        if is_postgres(conn):  # CREATE ... IF NOT EXISTS races on PostgreSQL's catalog: one at a time
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
        for table in METADATA.sorted_tables:
            conn.execute(CreateTable(table, if_not_exists=True))
            for index in table.indexes:
                conn.execute(CreateIndex(index, if_not_exists=True))
    if is_postgres(engine.url):  # a SQLite file may be removed and made again: checked each time
        _SCHEMA_READY.add(key)
    return engine


@contextmanager
def transaction(engine: Engine, *, write: bool = True) -> Iterator[Connection]:
    """One transaction on a connection of its own, committed when the block ends, rolled back if
    it raises. On SQLite a writer takes the write lock first (``BEGIN IMMEDIATE``), so writers are
    serialized; on PostgreSQL the statements lock what they need."""
    try:
        conn = engine.connect()
    except OperationalError as exc:  # retried where this process was connected before, or where the
        # server refuses or is starting or stopping (a restart: every Airflow task is a new process);
        # a wrong host name, password or database fails at once
        message = f"cannot connect to {describe(engine.url)}: {_first_line(exc)}"
        raise DatabaseError(message, transient=id(engine) in _REACHED or _restarting(exc)) from None
    if id(engine) not in _REACHED and is_postgres(engine.url):
        _REACHED.add(id(engine))
    with conn:
        if not is_postgres(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
        yield conn
        conn.commit()


def insert_for(conn: Connection, table: Table):
    """The dialect's INSERT (both have ON CONFLICT)."""
    return (postgresql.insert if is_postgres(conn) else sqlite.insert)(table)


def upsert(conn: Connection, table: Table, **values: object) -> None:
    """INSERT, or UPDATE the row with the same primary key (SQLite's INSERT OR REPLACE)."""
    keys = [c.name for c in table.primary_key.columns]
    statement = insert_for(conn, table).values(**values)
    changes = {name: statement.excluded[name] for name in values if name not in keys}
    conn.execute(statement.on_conflict_do_update(index_elements=keys, set_=changes))


def insert_many(conn: Connection, table: Table, rows: list[dict]) -> None:
    """A bulk INSERT (a planning chunk: tens of thousands of tasks). PostgreSQL: SQLAlchemy's
    multi-row VALUES batches (few round trips); SQLite: the driver's executemany on plain tuples,
    without SQLAlchemy's per-row parameter processing (a third of the planner's ledger time)."""
    if not rows:
        return
    if is_postgres(conn):
        conn.execute(table.insert(), rows)
        return
    names = list(rows[0])
    quote = conn.dialect.identifier_preparer.quote
    sql = f"INSERT INTO {quote(table.name)} ({', '.join(map(quote, names))}) VALUES ({', '.join('?' * len(names))})"
    conn.exec_driver_sql(sql, [tuple(row[name] for name in names) for row in rows])


def insert_missing(conn: Connection, table: Table, rows: list[dict], returning: str) -> set:
    """INSERT the rows whose primary key is not taken yet, in one statement (PostgreSQL waits for a
    concurrent transaction inserting the same key, then skips it); the ``returning`` column of
    the rows this call inserted. Rows are inserted in the given order: sort them, so concurrent
    callers lock keys in one order."""
    keys = [c.name for c in table.primary_key.columns]
    statement = insert_for(conn, table).on_conflict_do_nothing(index_elements=keys).returning(table.c[returning])
    return set(conn.execute(statement, rows).scalars())


def lock_table(conn: Connection, table: Table) -> None:
    """Serialize writers of ``table`` until the transaction ends; readers are not blocked.
    SQLite's BEGIN IMMEDIATE already does."""
    if is_postgres(conn):
        conn.exec_driver_sql(f"LOCK TABLE {table.name} IN EXCLUSIVE MODE")
