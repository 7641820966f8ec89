"""The knobs of a simulated world, and how a command line names one (``--world``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class WorldConfig:
    """The knobs of the simulated world (defaults: the project's first world, ``drift-base``)."""

    users: int = 4_000
    items: int = 1_500
    categories: int = 50
    activity_alpha: float = 1.5  # Pareto shape of user activity (smaller: a heavier tail of rare users)
    pop_skew: float = 1.0  # exposure ~ exp(pop_skew * popularity): larger shows the hits more
    new_items_per_hour: int = 6
    new_item_share: float = 0.2  # share of impressions that go to items born in the last day
    hot_hours: float = 12.0  # a new item's surge decays with this time constant
    hot_boost: float = 1.2  # logit boost of a just-born item
    taste_period_days: tuple[float, float] = (2.0, 6.0)  # user taste cycles
    taste_drift: float = 1.0  # amplitude of the slow taste drift (latent units)
    pop_period_days: tuple[float, float] = (1.5, 5.0)  # item popularity cycles
    pop_drift: float = 1.0
    flip_every_hours: float = 0.0  # abrupt flips: every so many hours categories' and items' offsets are redrawn
    flip_size: float = 1.0  # standard deviation of those offsets (logit units)
    diurnal: float = 0.6  # amplitude of the hour-of-day category preference
    weekly: float = 0.0  # amplitude of a day-of-week category preference
    traffic_diurnal: float = 0.3  # hour-of-day traffic swing around rows_per_hour
    surge_every_hours: int = 0  # traffic surges: every so many hours (0: none) ...
    surge_hours: int = 0  # ... the first so many hours carry ...
    surge_factor: float = 1.0  # ... this many times the traffic
    base_logit: float = -2.6
    extra_sparse: int = 0  # extra sparse context features f1..fN (docs/datagen.md)
    extra_cardinality: int = 1_000  # distinct values of each extra feature
    extra_effect: float = 0.3  # standard deviation of an extra feature value's logit effect
    stream_share: float = 1.0  # share of the impressions the stream carries (the batch has them all)
    realtime_label_minutes: float = 30.0  # the stream's label is emitted this long after the impression
    delay_median_minutes: float = 8.0
    delay_sigma: float = 1.5
    delay_price_elasticity: float = 0.8  # pricier items are clicked later (delay median ~ price^0.8)
    delay_category_sigma: float = 0.5  # and some categories later than others
    max_delay_hours: float = 6.0
    late_click_events: bool = False  # also re-send each click that missed the label window, at its own time

    def __post_init__(self) -> None:
        if not 0 < self.stream_share <= 1:
            raise ValueError(f"--world: stream_share={self.stream_share}: expected a share in (0, 1]")
        for name in ("users", "items", "categories", "extra_cardinality"):
            if getattr(self, name) < 1:
                raise ValueError(f"--world: {name}={getattr(self, name)}: expected a whole number >= 1")
        if self.extra_sparse < 0 or self.flip_every_hours < 0 or self.activity_alpha <= 0 or self.surge_factor <= 0:
            raise ValueError(
                "--world: extra_sparse and flip_every_hours must be >= 0, activity_alpha and surge_factor > 0"
            )
        if self.surge_every_hours < 0 or not 0 <= self.surge_hours <= self.surge_every_hours:
            raise ValueError("--world: expected 0 <= surge_hours <= surge_every_hours")

    def surging(self, hour: int) -> bool:
        """Whether absolute hour ``hour`` carries a surge's traffic."""
        return bool(self.surge_every_hours) and hour % self.surge_every_hours < self.surge_hours

    @property
    def extra_features(self) -> list[str]:
        """The extra sparse columns this world writes."""
        return [f"f{i + 1}" for i in range(self.extra_sparse)]


def world_config(text: str | None) -> WorldConfig:
    """``NAME``, ``key=value,...`` or ``NAME,key=value,...``: a named world of ``worlds.toml`` (default
    ``drift-base``) with overrides of :class:`WorldConfig` (e.g. ``late-heavy,delay_sigma=1``)."""
    from primus_lib.data.datagen.worlds import WORLDS

    items = [part.strip() for part in (text or "").split(",") if part.strip()]
    base: dict = {}
    if items and "=" not in items[0]:
        name = items.pop(0)
        if name not in WORLDS:
            raise ValueError(f"--world: {name!r}: expected a world name in {sorted(WORLDS)} or key=value")
        base = dict(WORLDS[name].overrides)
    defaults = dataclasses.asdict(WorldConfig())  # every knob has a default
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in defaults:
            raise ValueError(f"--world: {item!r}: expected key=value with key in {sorted(defaults)}")
        base[key] = _value(key, value, defaults[key])
    return WorldConfig(**base)


def _value(key: str, value: str, current: bool | int | float | tuple[float, ...]) -> object:
    try:
        if isinstance(current, bool):
            return {"1": True, "true": True, "0": False, "false": False}[value.lower()]
        if isinstance(current, tuple):
            return tuple(float(v) for v in value.split(":"))
        return type(current)(value)
    except (KeyError, ValueError):
        raise ValueError(f"--world: {key}={value!r}: expected {type(current).__name__}") from None
