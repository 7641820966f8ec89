"""One family per name and registry (primus_lib.metrics.registry): a second instrument reuses it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from primus_lib.metrics.registry import registered


def test_a_family_is_found_by_its_name_a_counter_with_or_without_total():
    registry = CollectorRegistry()
    assert registered(registry, "primus_x_total", Counter) is None
    counter = Counter("primus_x_total", "x", registry=registry)
    gauge = Gauge("primus_y", "y", registry=registry)
    assert registered(registry, "primus_x_total", Counter) is counter  # registered as primus_x
    assert registered(registry, "primus_x", Counter) is counter
    assert registered(registry, "primus_y", Gauge) is gauge


def test_a_family_of_another_kind_is_an_error_naming_it():
    registry = CollectorRegistry()
    Gauge("primus_y", "y", registry=registry)
    with pytest.raises(TypeError, match="'primus_y' is registered as a Gauge, not a Counter"):
        registered(registry, "primus_y", Counter)
