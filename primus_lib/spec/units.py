"""Parsing of the spec's human units: durations ("90s", "10m", "24h", "1d") and
Kubernetes quantities ("500m" CPU, "2Gi" memory)."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m|k|K|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?\s*$")
_QUANTITY_FACTOR = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """A duration such as ``"90s"``, ``"10m"``, ``"24h"``, ``"1d"``; bare numbers are seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("a duration such as '90s', '10m', '24h' or '1d'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a non-negative duration")
        return _seconds(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError("a duration such as '90s', '10m', '24h' or '1d'")
    number, unit = match.groups()
    return _seconds(float(number) * _DURATION_SECONDS[unit])


def _seconds(seconds: float) -> timedelta:
    try:
        return timedelta(seconds=seconds)
    except OverflowError:  # past timedelta's 999999999 days: not a duration anyone means
        raise ValueError("a duration such as '90s', '10m', '24h' or '1d' (at most 999999999d)") from None


def format_duration(value: timedelta) -> str:
    """The shortest exact spelling of a duration, the inverse of :func:`parse_duration`."""
    seconds = value.total_seconds()
    for unit in ("w", "d", "h", "m", "s"):
        size = _DURATION_SECONDS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_quantity(value: str | int | float) -> float:
    """A Kubernetes quantity as a plain number (cores for CPU, bytes for memory)."""
    if isinstance(value, bool):
        raise ValueError("a Kubernetes quantity such as 2, '500m' or '4Gi'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a non-negative quantity")
        return float(value)
    match = _QUANTITY.match(str(value))
    if not match:
        raise ValueError("a Kubernetes quantity such as 2, '500m' or '4Gi'")
    number, suffix = match.groups()
    return float(number) * _QUANTITY_FACTOR[suffix]


def format_memory(num_bytes: float) -> str:
    """Bytes as a Kubernetes memory quantity, rounded up to whole MiB."""
    mib = int(-(-num_bytes // 2**20))
    if mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"


def format_cpu(cores: float) -> str:
    """Cores as a Kubernetes CPU quantity (millicores when fractional)."""
    milli = int(round(cores * 1000))
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"
