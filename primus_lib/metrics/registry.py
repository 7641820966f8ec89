"""The metric family a registry already holds under a name: roles and managers that share a process
(tests, the embedded stack) register each family once and reuse it."""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

Family = TypeVar("Family", Counter, Gauge)


def registered(registry: CollectorRegistry, name: str, kind: type[Family]) -> Family | None:
    """The ``kind`` family registered under ``name`` (a counter's without its ``_total``), if any; a
    family of another kind under that name is an error naming it."""
    found = registry._names_to_collectors.get(name.removesuffix("_total") if kind is Counter else name)
    if found is None or isinstance(found, kind):
        return found
    raise TypeError(f"metric {name!r} is registered as a {type(found).__name__}, not a {kind.__name__}")
