"""Writing a world out: hourly partitions with success markers, the stream file, optionally Kafka.

Output (hourly, by impression hour)::

    impressions/YYYYMMDD/HH/part-00000.parquet + _SUCCESS  request_id, user_id, item_id, category,
                                                           price, age, [f1..fN,] ts (ms)
    clicks/YYYYMMDD/HH/part-00000.parquet + _SUCCESS       request_id, clicked (complete label)
    stream/events.jsonl                                    impression + real-time ``clicked``
                                                           (+ late clicks re-sent, with ``late_click_events``)
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from primus_lib.data.datagen.config import WorldConfig
from primus_lib.data.datagen.world import HOUR_MS, World
from primus_lib.data.schema import RESENT_CLICK_SUFFIX

IMPRESSION_COLUMNS = ["request_id", "user_id", "item_id", "category", "price", "age", "ts"]


def impression_columns(config: WorldConfig) -> list[str]:
    """The impression columns a world writes (its extra features before ``ts``)."""
    return [*IMPRESSION_COLUMNS[:-1], *config.extra_features, "ts"]


def iter_hours(start: datetime, end: datetime) -> Iterator[int]:
    """Absolute hour numbers (hours since the epoch) of [start, end)."""
    first = int(start.timestamp() // 3600)
    last = int(np.ceil(end.timestamp() / 3600))
    yield from range(first, last)


def hour_dir(root: Path, table: str, hour: int) -> Path:
    moment = datetime.fromtimestamp(hour * 3600, tz=UTC)
    return root / table / moment.strftime("%Y%m%d") / moment.strftime("%H")


@dataclass
class DatagenResult:
    out: Path
    hours: int
    impressions: int
    clicks: int
    realtime_clicks: int
    stream_path: Path
    kafka_messages: int = 0
    resent_clicks: int = 0  # late clicks re-sent on the stream (``late_click_events``)
    stream_rows: int = 0  # impressions the stream carries (all of them unless ``stream_share`` < 1)


FLUSH_SECONDS = 30  # how long the end of a run waits for the broker to confirm the stream


def generate(
    out: str | os.PathLike[str],
    start: datetime,
    end: datetime,
    *,
    rows_per_hour: int = 3000,
    seed: int = 0,
    config: WorldConfig | None = None,
    kafka: tuple[dict[str, str], str] | None = None,
    on_hour: Callable[[int, int], None] | None = None,
) -> DatagenResult:
    """Write the hourly partitions and the stream file for [start, end) under ``out``, and with
    ``kafka`` (librdkafka settings, topic) produce the stream there too: ``DeliveryError`` unless the
    broker confirmed every message. ``on_hour(hour, rows)`` after each hour is written (``primus
    datagen``'s progress)."""
    if end <= start:
        raise ValueError(f"datagen: --end {end.isoformat()} must be after --start {start.isoformat()}")
    if rows_per_hour <= 0:
        raise ValueError(f"datagen: --rows-per-hour must be positive, got {rows_per_hour}")
    out = Path(out)
    world = World.create(seed, config)
    columns = impression_columns(world.config)
    stream_dir = out / "stream"
    stream_dir.mkdir(parents=True, exist_ok=True)
    stream_tmp = stream_dir / f".events.jsonl.tmp-{uuid.uuid4().hex}"
    producer = _KafkaOut(*kafka) if kafka else None
    result = DatagenResult(out, 0, 0, 0, 0, stream_dir / "events.jsonl")
    late = LateClicks(world, rows_per_hour, first_hour=next(iter_hours(start, end)))
    try:
        with open(stream_tmp, "w", encoding="utf-8") as stream:
            for hour in iter_hours(start, end):
                rows = world.hour_rows(hour, rows_per_hour)
                _write_partition(hour_dir(out, "impressions", hour), {k: rows[k] for k in columns})
                hit = rows["clicked"] == 1
                _write_partition(
                    hour_dir(out, "clicks", hour),
                    {"request_id": rows["request_id"][hit], "clicked": rows["clicked"][hit]},
                )
                events = late.merge(hour, on_stream(rows))
                lines = _jsonl(events, columns)
                stream.write(lines)
                if producer is not None:
                    producer.send(lines, events["ts"])
                shown = int(rows["on_stream"].sum())
                result.resent_clicks += len(events["ts"]) - shown
                result.stream_rows += shown
                result.hours += 1
                result.impressions += len(rows["ts"])
                result.clicks += int(hit.sum())
                result.realtime_clicks += int((rows["clicked_realtime"] * rows["on_stream"]).sum())
                if on_hour is not None:
                    on_hour(hour, len(rows["ts"]))
        os.replace(stream_tmp, result.stream_path)
        if producer is not None:
            result.kafka_messages = producer.confirm(out)
    finally:
        if stream_tmp.exists():
            stream_tmp.unlink()
        if producer is not None:
            producer.close()
    return result


def on_stream(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rows the stream carries (``stream_share``)."""
    keep = rows["on_stream"]
    return rows if keep.all() else {k: v[keep] for k, v in rows.items()}


def _write_partition(directory: Path, columns: dict[str, np.ndarray]) -> None:
    """One parquet file plus ``_SUCCESS``, made visible by a rename of the directory."""
    table = pa.table({k: pa.array(v, type=pa.string() if k == "request_id" else None) for k, v in columns.items()})
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        pq.write_table(table, staging / "part-00000.parquet")
        (staging / "_SUCCESS").write_text("")
        if directory.exists():
            shutil.rmtree(directory)
        os.rename(staging, directory)
    except BaseException:  # no half-written staging directory left next to the partitions
        shutil.rmtree(staging, ignore_errors=True)
        raise


class LateClicks:
    """With ``late_click_events``: each click that landed after the stream's label window is
    re-sent as its own event at the click's time (impression features, real-time label 1, the key
    with ``RESENT_CLICK_SUFFIX``), merged into the stream in event-time order. Clicks of the hours
    before the range that land inside it are included, so any sub-range is generated identically."""

    def __init__(self, world: World, rows_per_hour: int, first_hour: int):
        self.world = world
        self.columns = impression_columns(world.config)
        self.on = world.config.late_click_events
        self.pending: dict[str, np.ndarray] = {}  # the re-sent clicks not due yet (none before the first _add)
        if self.on:
            lookback = int(np.ceil(world.config.max_delay_hours)) + 1
            for hour in range(first_hour - lookback, first_hour):
                self._add(on_stream(world.hour_rows(hour, rows_per_hour)), after_ms=first_hour * HOUR_MS)

    def _add(self, rows: dict[str, np.ndarray], after_ms: int = 0) -> None:
        late = (rows["clicked"] == 1) & (rows["clicked_realtime"] == 0)
        at = rows["ts"][late] + rows["click_delay_ms"][late]
        keep = at >= after_ms
        events = {k: rows[k][late][keep] for k in self.columns}
        events["ts"] = at[keep]
        events["request_id"] = np.array([f"{r}{RESENT_CLICK_SUFFIX}" for r in events["request_id"]], dtype=object)
        events["clicked_realtime"] = np.ones(int(keep.sum()), dtype=np.int64)
        self.pending = _concat(self.pending, events) if self.pending else events

    def merge(self, hour: int, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The hour's stream events: its impressions plus the re-sent clicks that land in it."""
        if not self.on:
            return rows
        self._add(rows)
        due = self.pending["ts"] < (hour + 1) * HOUR_MS
        out = _concat({k: rows[k] for k in self.pending}, {k: v[due] for k, v in self.pending.items()})
        self.pending = {k: v[~due] for k, v in self.pending.items()}
        order = np.argsort(out["ts"], kind="stable")
        return {k: v[order] for k, v in out.items()}


def _concat(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([a[k], b[k]]) for k in a}


def _jsonl(rows: dict[str, np.ndarray], keys: list[str]) -> str:
    columns = [rows[k].tolist() for k in keys] + [rows["clicked_realtime"].tolist()]
    names = [*keys, "clicked"]
    return "".join(json.dumps(dict(zip(names, values, strict=True))) + "\n" for values in zip(*columns, strict=True))


class DeliveryError(RuntimeError):
    """The files were written, but the broker did not confirm every message of the stream."""


class _KafkaOut:
    """The stream's lines to a Kafka topic, each message's delivery counted (librdkafka reports it
    through ``on_delivery``; a message still queued at the end was not delivered)."""

    def __init__(self, config: dict[str, str], topic: str):
        from confluent_kafka import Producer

        from primus_lib.data.sources.kafka import LoginWatch

        self.login = LoginWatch(f"kafka topic {topic!r} at {config.get('bootstrap.servers')}")
        self.producer = Producer({"linger.ms": 20, "enable.idempotence": False, **config, "error_cb": self.login})
        self.topic = topic
        self.sent = self.failed = 0
        self.error: object = None  # the first delivery error

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.failed += 1
            self.error = self.error or err

    def send(self, lines: str, ts: np.ndarray) -> None:
        for line, stamp in zip(lines.splitlines(), ts.tolist(), strict=True):
            while True:
                try:
                    self.producer.produce(
                        self.topic, value=line.encode(), timestamp=int(stamp), on_delivery=self._delivered
                    )
                    break
                except BufferError:
                    self.producer.poll(0.5)
            self.sent += 1
        self.producer.poll(0)

    def confirm(self, out: Path) -> int:
        """The messages the broker confirmed: all of them, else ``DeliveryError``."""
        deadline = time.monotonic() + FLUSH_SECONDS
        queued = self.producer.flush(0)
        while queued and self.login.refused is None and (left := deadline - time.monotonic()) > 0:
            queued = self.producer.flush(min(1.0, left))  # a second at a time: a refused login stops it
        if queued or self.failed:
            why = f" within {FLUSH_SECONDS} s" + (f" (first error: {self.error})" if self.error is not None else "")
            if self.login.refused is not None:  # served by flush: the reason nothing was delivered
                why = f": {self.login.who}: the broker refused the login ({self.login.refused.str()})"
            raise DeliveryError(
                f"datagen: the partitions and stream file under {out} are complete, but Kafka topic "
                f"{self.topic!r} confirmed {self.sent - queued - self.failed} of {self.sent} messages{why}"
            )
        return self.sent

    def close(self) -> None:
        """Drop what is still queued (an error already said so): the producer's teardown would wait."""
        self.producer.purge()
        self.producer.flush(0)


def default_range(job) -> tuple[datetime, datetime]:
    """The spec's timer range; an open-ended timer gets two days."""
    timer = job.spec.timer
    return timer.start, timer.end or timer.start + timedelta(days=2)
