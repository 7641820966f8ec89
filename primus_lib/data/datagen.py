"""Synthetic CTR logs with the drift of production logs (``primus datagen``).

Users, items, categories, prices and ages; the click probability drifts over time: item
popularity and user tastes move slowly (multi-day cycles plus a diurnal cycle per
category), new items appear every hour and are hot for a while, and clicks land minutes to
hours after the impression, so the real-time label of the stream misses the late ones. The
model of the world is in docs/datagen.md. Everything is a function of the seed and the
absolute hour, so any sub-range of hours is generated identically.

Output (hourly, by impression hour)::

    impressions/YYYYMMDD/HH/part-00000.parquet + _SUCCESS  request_id, user_id, item_id,
                                                           category, price, age, ts (ms)
    clicks/YYYYMMDD/HH/part-00000.parquet + _SUCCESS       request_id, clicked (complete label)
    stream/events.jsonl                                    impression + real-time ``clicked``
                                                           (+ late clicks re-sent, with ``late_click_events``)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from primus_lib.data.schema import RESENT_CLICK_SUFFIX

HOUR_MS = 3_600_000
DIM = 8  # latent taste dimensions
NEW_ITEM_BASE = 1_000_000  # ids of items born during the run start here


@dataclass(frozen=True)
class WorldConfig:
    """The knobs of the simulated world (defaults are the documented ones)."""

    users: int = 4_000
    items: int = 1_500
    categories: int = 50
    new_items_per_hour: int = 6
    new_item_share: float = 0.2  # share of impressions that go to items born in the last day
    hot_hours: float = 12.0  # a new item's surge decays with this time constant
    hot_boost: float = 1.2  # logit boost of a just-born item
    taste_period_days: tuple[float, float] = (2.0, 6.0)  # user taste cycles
    taste_drift: float = 1.0  # amplitude of the slow taste drift (latent units)
    pop_period_days: tuple[float, float] = (1.5, 5.0)  # item popularity cycles
    pop_drift: float = 1.0
    diurnal: float = 0.6  # amplitude of the hour-of-day category preference
    traffic_diurnal: float = 0.3  # hour-of-day traffic swing around rows_per_hour
    base_logit: float = -2.6
    realtime_label_minutes: float = 30.0  # the stream's label is emitted this long after the impression
    delay_median_minutes: float = 8.0
    delay_sigma: float = 1.5
    delay_price_elasticity: float = 0.8  # pricier items are clicked later (delay median ~ price^0.8)
    delay_category_sigma: float = 0.5  # and some categories later than others
    max_delay_hours: float = 6.0
    late_click_events: bool = False  # also re-send each click that missed the label window, at its own time


def world_config(text: str | None) -> WorldConfig:
    """``key=value,...`` overrides of :class:`WorldConfig` (e.g. ``delay_price_elasticity=0``)."""
    config = WorldConfig()
    if not text:
        return config
    known = {f.name: f for f in dataclasses.fields(WorldConfig)}
    updates: dict = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--world: {item!r}: expected key=value with key in {sorted(known)}")
        current = getattr(config, key)
        try:
            if isinstance(current, bool):
                updates[key] = {"1": True, "true": True, "0": False, "false": False}[value.lower()]
            elif isinstance(current, tuple):
                updates[key] = tuple(float(v) for v in value.split(":"))
            else:
                updates[key] = type(current)(value)
        except (KeyError, ValueError):
            raise ValueError(f"--world: {key}={value!r}: expected {type(current).__name__}") from None
    return dataclasses.replace(config, **updates)


@dataclass
class World:
    """Entities drawn once per seed; their time-dependent state comes from ``hour_params``."""

    config: WorldConfig
    seed: int
    user_taste: np.ndarray = field(repr=False)
    user_drift: np.ndarray = field(repr=False)
    user_period: np.ndarray = field(repr=False)
    user_phase: np.ndarray = field(repr=False)
    user_age: np.ndarray = field(repr=False)
    user_activity: np.ndarray = field(repr=False)
    cat_vec: np.ndarray = field(repr=False)
    cat_phase: np.ndarray = field(repr=False)
    cat_age_slope: np.ndarray = field(repr=False)
    cat_delay: np.ndarray = field(repr=False)
    item_vec: np.ndarray = field(repr=False)
    item_cat: np.ndarray = field(repr=False)
    item_price: np.ndarray = field(repr=False)
    item_pop: np.ndarray = field(repr=False)
    item_period: np.ndarray = field(repr=False)
    item_phase: np.ndarray = field(repr=False)

    @classmethod
    def create(cls, seed: int, config: WorldConfig | None = None) -> World:
        c = config or WorldConfig()
        rng = np.random.default_rng([seed, 0])
        cat_vec = rng.normal(0, 1, (c.categories, DIM))
        item_cat = rng.integers(0, c.categories, c.items)
        activity = rng.pareto(1.5, c.users) + 1.0
        return cls(
            config=c,
            seed=seed,
            user_taste=rng.normal(0, 0.5, (c.users, DIM)),
            user_drift=rng.normal(0, 1, (c.users, DIM)) / np.sqrt(DIM),
            user_period=rng.uniform(*c.taste_period_days, c.users) * 24.0,
            user_phase=rng.uniform(0, 2 * np.pi, c.users),
            user_age=np.clip(rng.normal(38, 12, c.users), 16, 80),
            user_activity=activity / activity.sum(),
            cat_vec=cat_vec,
            cat_phase=rng.uniform(0, 2 * np.pi, c.categories),
            cat_age_slope=rng.normal(0, 0.5, c.categories),
            cat_delay=rng.normal(0, c.delay_category_sigma, c.categories),
            item_vec=cat_vec[item_cat] * 0.7 + rng.normal(0, 0.5, (c.items, DIM)),
            item_cat=item_cat,
            item_price=np.exp(rng.normal(3.0, 0.8, c.items)),
            item_pop=rng.normal(0, 0.7, c.items),
            item_period=rng.uniform(*c.pop_period_days, c.items) * 24.0,
            item_phase=rng.uniform(0, 2 * np.pi, c.items),
        )

    def new_items(self, hour: int) -> dict[str, np.ndarray]:
        """The items born in absolute hour ``hour`` (same for every run with this seed)."""
        c = self.config
        rng = np.random.default_rng([self.seed, 1, hour])
        n = c.new_items_per_hour
        cat = rng.integers(0, c.categories, n)
        return {
            "id": NEW_ITEM_BASE + hour * n + np.arange(n),
            "vec": self.cat_vec[cat] * 0.7 + rng.normal(0, 0.5, (n, DIM)),
            "cat": cat,
            "price": np.exp(rng.normal(3.0, 0.8, n)),
            "pop": rng.normal(0.3, 0.7, n),
            "born": np.full(n, float(hour)) + rng.uniform(0, 1, n),
        }

    def popularity(self, hour: float) -> np.ndarray:
        """Catalog items' popularity at ``hour``: a base plus a multi-day cycle."""
        c = self.config
        return self.item_pop + c.pop_drift * np.sin(2 * np.pi * hour / self.item_period + self.item_phase)

    def taste(self, users: np.ndarray, t: np.ndarray | float) -> np.ndarray:
        """Users' latent tastes at time ``t`` (hours): a base plus a slow multi-day swing."""
        drift = np.sin(2 * np.pi * np.asarray(t) / self.user_period[users] + self.user_phase[users])
        return self.user_taste[users] + self.config.taste_drift * np.atleast_1d(drift)[:, None] * self.user_drift[users]

    def hour_rows(self, hour: int, rows_per_hour: int) -> dict[str, np.ndarray]:
        """The impressions of absolute hour ``hour`` (hours since the epoch), with labels."""
        c = self.config
        rng = np.random.default_rng([self.seed, 2, hour])
        hod = hour % 24
        n = max(1, int(round(rows_per_hour * (1 + c.traffic_diurnal * np.sin(2 * np.pi * (hod - 8) / 24)))))
        t = hour + np.sort(rng.uniform(0, 1, n))  # event time in hours, sorted

        # Who: users by activity.
        users = rng.choice(c.users, n, p=self.user_activity)

        # What: catalog items by their current popularity, or items born in the last day.
        pop_now = self.popularity(hour)
        exposure = np.exp(pop_now - pop_now.max())
        catalog = rng.choice(c.items, n, p=exposure / exposure.sum())
        recent = [self.new_items(h) for h in range(hour - 23, hour + 1)]
        new = {k: np.concatenate([r[k] for r in recent]) for k in recent[0]}
        age_h = np.maximum(t[:, None] - new["born"][None, :], -1.0)  # per row, per new item
        alive = age_h >= 0
        heat = np.where(alive, np.exp(-np.maximum(age_h, 0) / c.hot_hours), 0.0)
        pick_new = (rng.uniform(0, 1, n) < c.new_item_share) & alive.any(axis=1)
        weights = heat[pick_new]
        cum = np.cumsum(weights, axis=1)
        draws = rng.uniform(0, 1, pick_new.sum()) * cum[:, -1]
        new_idx = np.minimum((cum < draws[:, None]).sum(axis=1), cum.shape[1] - 1)

        item_id = catalog.astype(np.int64)
        vec = self.item_vec[catalog].copy()
        cat = self.item_cat[catalog].copy()
        price = self.item_price[catalog].copy()
        pop = pop_now[catalog].copy()
        item_id[pick_new] = new["id"][new_idx]
        vec[pick_new] = new["vec"][new_idx]
        cat[pick_new] = new["cat"][new_idx]
        price[pick_new] = new["price"][new_idx]
        rows_new = np.flatnonzero(pick_new)
        hot = np.exp(-np.maximum(t[rows_new] - new["born"][new_idx], 0) / c.hot_hours)
        pop[pick_new] = new["pop"][new_idx] + c.hot_boost * hot

        # Click probability at the event time.
        taste = self.taste(users, t)
        affinity = (taste * vec).sum(axis=1) / np.sqrt(DIM)
        diurnal = c.diurnal * np.sin(2 * np.pi * (t % 24) / 24 + self.cat_phase[cat])
        age = self.user_age[users]
        age_effect = self.cat_age_slope[cat] * (age - 38) / 12
        price_effect = -0.4 * (np.log(price) - 3.0)
        logit = c.base_logit + 1.2 * affinity + 0.6 * pop + diurnal + age_effect + price_effect
        p_click = 1 / (1 + np.exp(-logit))
        clicked = rng.uniform(0, 1, n) < p_click

        # When the click lands: the stream's real-time label only sees the early ones.
        median = np.log(c.delay_median_minutes) + c.delay_price_elasticity * (np.log(price) - 3.0) + self.cat_delay[cat]
        delay_min = np.exp(rng.normal(median, c.delay_sigma, n))
        delay_min = np.minimum(delay_min, c.max_delay_hours * 60)
        realtime = clicked & (delay_min <= c.realtime_label_minutes)

        ts = (t * HOUR_MS).astype(np.int64)
        return {
            "request_id": np.array([f"{hour:07x}-{i:06x}" for i in range(n)], dtype=object),
            "user_id": users.astype(np.int64),
            "item_id": item_id,
            "category": cat.astype(np.int64),
            "price": np.round(price, 2).astype(np.float64),
            "age": np.round(age, 1).astype(np.float64),
            "ts": ts,
            "clicked": clicked.astype(np.int64),
            "clicked_realtime": realtime.astype(np.int64),
            "click_delay_ms": (delay_min * 60_000).astype(np.int64),
            "p_click": p_click,  # the truth, for oracle AUC in docs/tests; never written out
        }


IMPRESSION_COLUMNS = ["request_id", "user_id", "item_id", "category", "price", "age", "ts"]


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


def generate(
    out: Path,
    start: datetime,
    end: datetime,
    *,
    rows_per_hour: int = 3000,
    seed: int = 0,
    config: WorldConfig | None = None,
    kafka: tuple[str, str] | None = None,
    on_hour: Callable[[int, int], None] | None = None,
) -> DatagenResult:
    """Write the hourly partitions and the stream file for [start, end) under ``out``;
    ``on_hour(hour, rows)`` after each hour is written (``primus datagen``'s progress)."""
    if end <= start:
        raise ValueError(f"datagen: --end {end.isoformat()} must be after --start {start.isoformat()}")
    if rows_per_hour <= 0:
        raise ValueError(f"datagen: --rows-per-hour must be positive, got {rows_per_hour}")
    out = Path(out)
    world = World.create(seed, config)
    stream_dir = out / "stream"
    stream_dir.mkdir(parents=True, exist_ok=True)
    stream_tmp = stream_dir / f".events.jsonl.tmp-{uuid.uuid4().hex}"
    producer = _kafka_producer(kafka[0]) if kafka else None
    result = DatagenResult(out, 0, 0, 0, 0, stream_dir / "events.jsonl")
    late = LateClicks(world, rows_per_hour, first_hour=next(iter_hours(start, end)))
    try:
        with open(stream_tmp, "w", encoding="utf-8") as stream:
            for hour in iter_hours(start, end):
                rows = world.hour_rows(hour, rows_per_hour)
                _write_partition(hour_dir(out, "impressions", hour), {k: rows[k] for k in IMPRESSION_COLUMNS})
                hit = rows["clicked"] == 1
                _write_partition(
                    hour_dir(out, "clicks", hour),
                    {"request_id": rows["request_id"][hit], "clicked": rows["clicked"][hit]},
                )
                events = late.merge(hour, rows)
                lines = _jsonl(events)
                stream.write(lines)
                if producer is not None:
                    result.kafka_messages += _produce(producer, kafka[1], lines, events["ts"])
                result.resent_clicks += len(events["ts"]) - len(rows["ts"])
                result.hours += 1
                result.impressions += len(rows["ts"])
                result.clicks += int(hit.sum())
                result.realtime_clicks += int(rows["clicked_realtime"].sum())
                if on_hour is not None:
                    on_hour(hour, len(rows["ts"]))
        os.replace(stream_tmp, result.stream_path)
    finally:
        if stream_tmp.exists():
            stream_tmp.unlink()
        if producer is not None:
            producer.flush(30)
    return result


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
        self.on = world.config.late_click_events
        self.pending: dict[str, np.ndarray] | None = None
        if self.on:
            lookback = int(np.ceil(world.config.max_delay_hours)) + 1
            for hour in range(first_hour - lookback, first_hour):
                self._add(world.hour_rows(hour, rows_per_hour), after_ms=first_hour * HOUR_MS)

    def _add(self, rows: dict[str, np.ndarray], after_ms: int = 0) -> None:
        late = (rows["clicked"] == 1) & (rows["clicked_realtime"] == 0)
        at = rows["ts"][late] + rows["click_delay_ms"][late]
        keep = at >= after_ms
        events = {k: rows[k][late][keep] for k in IMPRESSION_COLUMNS}
        events["ts"] = at[keep]
        events["request_id"] = np.array([f"{r}{RESENT_CLICK_SUFFIX}" for r in events["request_id"]], dtype=object)
        events["clicked_realtime"] = np.ones(int(keep.sum()), dtype=np.int64)
        self.pending = events if self.pending is None else _concat(self.pending, events)

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


def _jsonl(rows: dict[str, np.ndarray]) -> str:
    keys = [*IMPRESSION_COLUMNS]
    columns = [rows[k].tolist() for k in keys] + [rows["clicked_realtime"].tolist()]
    names = [*keys, "clicked"]
    return "".join(json.dumps(dict(zip(names, values, strict=True))) + "\n" for values in zip(*columns, strict=True))


def _kafka_producer(bootstrap: str):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": False})


def _produce(producer, topic: str, lines: str, ts: np.ndarray) -> int:
    count = 0
    for line, stamp in zip(lines.splitlines(), ts.tolist(), strict=True):
        while True:
            try:
                producer.produce(topic, value=line.encode(), timestamp=int(stamp))
                break
            except BufferError:
                producer.poll(0.5)
        count += 1
    producer.poll(0)
    return count


def default_range(job) -> tuple[datetime, datetime]:
    """The spec's timer range; an open-ended timer gets two days."""
    timer = job.spec.timer
    return timer.start, timer.end or timer.start + timedelta(days=2)
