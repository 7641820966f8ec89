"""The simulated world: users, items and categories drawn once per seed, and the impressions of
any absolute hour with their click probability, click and click delay.

Every value is a function of the seed and the absolute hour, so any sub-range of hours is
generated identically. Mechanisms that the first world did not have (flips, weekly seasonality,
extra features, a sampled stream) draw from random streams of their own, so a world without
them is byte-identical to what the first generator wrote. The model is in docs/datagen.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from primus_lib.data.datagen.config import WorldConfig

HOUR_MS = 3_600_000
DIM = 8  # latent taste dimensions
NEW_ITEM_BASE = 1_000_000  # ids of items born during the run start here
ZIPF = 1.05  # popularity exponent of the extra features' values


@dataclass
class World:
    """Entities drawn once per seed; their time-dependent state comes from the hour."""

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
    cat_week_phase: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    extra_effect: list[np.ndarray] = field(repr=False, default_factory=list)  # per extra feature, per value
    extra_popularity: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))

    @classmethod
    def create(cls, seed: int, config: WorldConfig | None = None) -> World:
        c = config or WorldConfig()
        rng = np.random.default_rng([seed, 0])
        cat_vec = rng.normal(0, 1, (c.categories, DIM))
        item_cat = rng.integers(0, c.categories, c.items)
        activity = rng.pareto(c.activity_alpha, c.users) + 1.0
        more = np.random.default_rng([seed, 4])  # mechanisms added after the first world
        ranks = np.arange(1, c.extra_cardinality + 1, dtype=np.float64) ** -ZIPF
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
            cat_week_phase=more.uniform(0, 2 * np.pi, c.categories),
            extra_effect=[more.normal(0, c.extra_effect, c.extra_cardinality) for _ in range(c.extra_sparse)],
            extra_popularity=ranks / ranks.sum(),
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

    def flip_offsets(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Abrupt flips: the categories' and catalog items' logit offsets of flip epoch ``epoch``."""
        c = self.config
        rng = np.random.default_rng([self.seed, 3, epoch])
        return rng.normal(0, c.flip_size, c.categories), rng.normal(0, c.flip_size, c.items)

    def hour_rows(self, hour: int, rows_per_hour: int) -> dict[str, np.ndarray]:
        """The impressions of absolute hour ``hour`` (hours since the epoch), with labels."""
        c = self.config
        rng = np.random.default_rng([self.seed, 2, hour])
        hod = hour % 24
        n = max(1, int(round(rows_per_hour * (1 + c.traffic_diurnal * np.sin(2 * np.pi * (hod - 8) / 24)))))
        if c.surging(hour):
            n = int(round(n * c.surge_factor))
        t = hour + np.sort(rng.uniform(0, 1, n))  # event time in hours, sorted

        # Who: users by activity.
        users = rng.choice(c.users, n, p=self.user_activity)

        # What: catalog items by their current popularity, or items born in the last day.
        pop_now = self.popularity(hour)
        exposure = np.exp(c.pop_skew * (pop_now - pop_now.max()))
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
        extra = self._extra(hour, n, t, cat, catalog, pick_new)
        logit = logit + extra.pop("logit")
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
            **extra,
            "ts": ts,
            "clicked": clicked.astype(np.int64),
            "clicked_realtime": realtime.astype(np.int64),
            "click_delay_ms": (delay_min * 60_000).astype(np.int64),
            "p_click": p_click,  # the truth, for oracle AUC in docs/tests; never written out
        }

    def _extra(
        self, hour: int, n: int, t: np.ndarray, cat: np.ndarray, catalog: np.ndarray, pick_new: np.ndarray
    ) -> dict[str, np.ndarray]:
        """What the mechanisms added after the first world put on the logit (``logit``), the extra
        features' columns, and ``on_stream`` (whether the stream carries the row)."""
        c = self.config
        logit = np.zeros(n)
        if c.weekly:
            logit += c.weekly * np.sin(2 * np.pi * (t % 168) / 168 + self.cat_week_phase[cat])
        if c.flip_every_hours:
            epochs = np.floor(t / c.flip_every_hours).astype(np.int64)
            for epoch in np.unique(epochs):
                rows = epochs == epoch
                cat_offset, item_offset = self.flip_offsets(int(epoch))
                logit[rows] += cat_offset[cat[rows]] + np.where(pick_new[rows], 0.0, item_offset[catalog[rows]])
        out: dict[str, np.ndarray] = {}
        rng = np.random.default_rng([self.seed, 5, hour])
        for name, effect in zip(c.extra_features, self.extra_effect, strict=True):
            values = rng.choice(c.extra_cardinality, n, p=self.extra_popularity)
            logit += effect[values]
            out[name] = values.astype(np.int64)
        out["on_stream"] = rng.uniform(0, 1, n) < c.stream_share if c.stream_share < 1 else np.ones(n, dtype=bool)
        out["logit"] = logit
        return out
