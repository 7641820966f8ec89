"""A real public log for ``primus eval``: the Open Bandit Dataset sample inside the ``obp`` wheel.

``obp`` (Open Bandit Pipeline, PyPI, a dev dependency) ships 10,000 logged impressions per
policy (random, bts) and campaign (all, men, women) of ZOZOTOWN's fashion recommendations,
2019-11-24..30: timestamp, item_id, position, click, user features, user-item affinities.
Nothing is downloaded: the CSVs are read from the installed distribution's files (without
importing obp, whose code we do not need).

``convert(out)`` writes what ``config/jobs/obd-eval.yaml`` reads:

    impressions/YYYYMMDD/HH/part-00000.parquet + _SUCCESS   one hourly partition, complete label
    stream/events.jsonl                                      the same impressions, real-time label

The log has no click times, so the label delay is simulated and stated: each click misses
the real-time label with probability ``late_fraction`` (default 0.2, the share the synthetic
world's stream misses), drawn with ``seed``; the batch partition's label is the logged click.

    python -m primus_lib.evaluation.public_log OUT [--late-fraction 0.2] [--seed 0]
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
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

PACKAGE = "obp"
FILES = [f"obp/dataset/obd/{policy}/{c}/{c}.csv" for policy in ("random", "bts") for c in ("all", "men", "women")]
START = datetime(2019, 11, 24, tzinfo=UTC)
END = datetime(2019, 12, 1, tzinfo=UTC)
USER = [f"user_feature_{i}" for i in range(4)]


class PublicLogError(RuntimeError):
    """The packaged log is missing or not what this converter expects (one line)."""


@dataclass
class Converted:
    out: Path
    rows: int
    clicks: int
    realtime_clicks: int
    partitions: int


def packaged_files() -> list[Path]:
    """The CSVs inside the installed ``obp`` distribution."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise PublicLogError(f"package {PACKAGE!r} is not installed (a dev dependency: make install)") from None
    paths = [Path(str(dist.locate_file(f))) for f in FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise PublicLogError(f"{PACKAGE}: packaged log file missing: {missing[0]}")
    return paths


def load() -> pa.Table:
    """All six logs as one table of samples (ids as strings, epoch-ms timestamps, sorted by time)."""
    parts = []
    for path in packaged_files():
        policy, campaign = path.parts[-3], path.parts[-2]
        try:
            raw = pacsv.read_csv(
                path, convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in USER})
            )
        except pa.ArrowInvalid as exc:
            raise PublicLogError(f"{path}: not a readable CSV: {' '.join(str(exc).split())}") from None
        need = ["timestamp", "item_id", "position", "click", *USER]
        absent = [c for c in need if c not in raw.column_names]
        if absent:
            raise PublicLogError(f"{path}: column {absent[0]!r} missing")
        item = raw.column("item_id").to_numpy()
        affinity_columns = [c for c in raw.column_names if c.startswith("user-item_affinity_")]
        affinity = np.stack([raw.column(c).to_numpy(zero_copy_only=False) for c in affinity_columns], axis=1)
        n = raw.num_rows
        ts = pc.cast(raw.column("timestamp"), pa.timestamp("ms", tz="UTC"), safe=False).cast(pa.int64())
        columns = {
            "request_id": [f"{policy}-{campaign}-{i}" for i in range(n)],
            "ts": ts,
            "item": [f"{campaign}:{i}" for i in item.tolist()],
            "position": raw.column("position").cast(pa.int64()),
            "campaign": [campaign] * n,
            **{c: raw.column(c) for c in USER},
            "affinity": affinity[np.arange(n), np.clip(item, 0, affinity.shape[1] - 1)].astype(np.float32),
            "clicked": raw.column("click").cast(pa.int64()),
        }
        parts.append(pa.table(columns))
    table = pa.concat_tables(parts)
    return table.sort_by([("ts", "ascending"), ("request_id", "ascending")])


def convert(out: Path, late_fraction: float = 0.2, seed: int = 0) -> Converted:
    """Hourly batch partitions (complete labels) and the stream replay (real-time labels) under ``out``."""
    if not 0.0 <= late_fraction < 1.0:
        raise PublicLogError(f"--late-fraction: expected a number in [0, 1), got {late_fraction}")
    table = load()
    clicked = table.column("clicked").to_numpy()
    late = np.random.default_rng(seed).random(table.num_rows) < late_fraction
    realtime = (clicked & ~late).astype(np.int64)
    ts = table.column("ts").to_numpy()
    hour = START
    partitions = 0
    while hour < END:
        lo = int(hour.timestamp() * 1000)
        mask = (ts >= lo) & (ts < lo + 3_600_000)
        directory = out / "impressions" / f"{hour:%Y%m%d}" / f"{hour:%H}"
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.filter(pa.array(mask)), directory / "part-00000.parquet")
        (directory / "_SUCCESS").write_text("")
        partitions += 1
        hour += timedelta(hours=1)
    stream = out / "stream"
    stream.mkdir(parents=True, exist_ok=True)
    rows = table.drop(["clicked"]).append_column("clicked", pa.array(realtime)).to_pylist()
    tmp = stream / ".events.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    tmp.replace(stream / "events.jsonl")
    return Converted(out, table.num_rows, int(clicked.sum()), int(realtime.sum()), partitions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m primus_lib.evaluation.public_log", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--late-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        done = convert(args.out, args.late_fraction, args.seed)
    except PublicLogError as exc:
        print(f"public_log: {exc}", file=sys.stderr)
        return 2
    print(
        f"{done.rows} impressions, {done.clicks} clicks ({done.realtime_clicks} in real time), "
        f"{done.partitions} hourly partitions under {done.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
