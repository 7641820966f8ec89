"""The named worlds MTRM and the baselines are judged on (``primus datagen --world NAME``,
``primus eval --world NAME``).

They vary along the axes that decide which training mode wins: the share of clicks too late for
the stream's label and how late they come, the kind of drift (slow taste drift, hype waves of
new items, abrupt flips of whole categories, daily and weekly seasonality), popularity skew and
rare users, the number and cardinality of sparse features, and how much of the traffic the stream
carries. ``split`` says which were used to choose the defaults (``development``), which were held
out by an earlier plan and have been run and read since (``seen``: their failures motivated the
designs after them, docs/training.md), and which never were (``held-out``): docs/eval-plan.md fixed
that split before any held-out run. ``reserved`` worlds, when there are any, were defined before any
design they will judge and never trained on: a later plan holds them out (``make eval-worlds``
leaves them alone). ``probe`` worlds are instruments (the priority rule's surge), not judged.

The catalogue lives in ``worlds.toml`` beside this module: shared override tables (``[presets]``) and
one ``[[world]]`` table per world, read here in file order.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Literal, get_args

Split = Literal["development", "seen", "held-out", "reserved", "probe"]


@dataclass(frozen=True)
class NamedWorld:
    name: str
    split: Split
    late: float  # share of clicks too late for the stream's label (measured on seed 0, 2 days)
    about: str
    overrides: dict = field(default_factory=dict)


def _load(filename: str = "worlds.toml") -> list[NamedWorld]:
    """The worlds of ``filename`` (beside this module), checked; lists become tuples."""
    path = files("primus_lib.data.datagen").joinpath(filename)
    doc = tomllib.loads(path.read_text(encoding="utf-8"))

    def tuples(table: dict) -> dict:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}

    presets = {name: tuples(table) for name, table in doc.get("presets", {}).items()}
    worlds: list[NamedWorld] = []
    for i, entry in enumerate(doc.get("world", [])):
        where = f"{path}: world {entry.get('name', f'#{i + 1}')!r}"
        if missing := {"name", "split", "late", "about"} - entry.keys():
            raise ValueError(f"{where}: missing {sorted(missing)}")
        if unknown := entry.keys() - {"name", "split", "late", "about", "presets", "overrides"}:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        if entry["split"] not in get_args(Split):
            raise ValueError(f"{where}: split {entry['split']!r} is not one of {'|'.join(get_args(Split))}")
        if any(w.name == entry["name"] for w in worlds):
            raise ValueError(f"{where}: defined twice")
        overrides: dict = {}
        for preset in entry.get("presets", []):
            if preset not in presets:
                raise ValueError(f"{where}: unknown preset {preset!r} (expected one of {sorted(presets)})")
            overrides.update(presets[preset])
        overrides.update(tuples(entry.get("overrides", {})))
        worlds.append(NamedWorld(entry["name"], entry["split"], float(entry["late"]), entry["about"], overrides))
    return worlds


_WORLDS = _load()
WORLDS: dict[str, NamedWorld] = {w.name: w for w in _WORLDS}
# not judged: the world of the priority rule's measurement (docs/training.md, "The priority rule")
SURGE = WORLDS["stream-surge"]


def names(split: str | None = None) -> list[str]:
    """The worlds' names, of one split or all."""
    return [w.name for w in _WORLDS if split is None or w.split == split]
