"""Synthetic CTR logs with the drift of production logs (``primus datagen``), in a family of worlds.

Users, items, categories, prices and ages; the click probability drifts over time (item
popularity and user tastes move slowly, categories have their hours and days, new items are hot
for a while, whole categories flip at once), and clicks land minutes to hours after the
impression, so the real-time label of the stream misses the late ones. ``worlds.toml`` names the
worlds the backtest is judged on; docs/datagen.md has the model.

- ``config.py``: ``WorldConfig`` (the knobs) and ``world_config`` (``--world NAME,key=value``);
- ``world.py``: ``World``, the entities of one seed and the impressions of any hour;
- ``worlds.py``: the named worlds (``worlds.toml``), development, seen, held-out and reserved;
- ``write.py``: ``generate``, the partitions, the stream file and Kafka.
"""

from __future__ import annotations

from primus_lib.data.datagen.config import WorldConfig, world_config
from primus_lib.data.datagen.world import HOUR_MS, NEW_ITEM_BASE, World
from primus_lib.data.datagen.write import (
    IMPRESSION_COLUMNS,
    DatagenResult,
    DeliveryError,
    LateClicks,
    default_range,
    generate,
    hour_dir,
    impression_columns,
    iter_hours,
)

__all__ = [
    "HOUR_MS",
    "IMPRESSION_COLUMNS",
    "NEW_ITEM_BASE",
    "DatagenResult",
    "DeliveryError",
    "LateClicks",
    "World",
    "WorldConfig",
    "default_range",
    "generate",
    "hour_dir",
    "impression_columns",
    "iter_hours",
    "world_config",
]
