"""Annotated field types shared by the spec models, each with the schema the CRD needs."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BeforeValidator, PlainSerializer, WithJsonSchema

from primus_lib.spec.units import format_duration, parse_duration, parse_quantity
from primus_lib.timegrid import as_utc, iso

_INT_OR_STRING = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}

Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({**_INT_OR_STRING, "description": "duration: 90s, 10m, 24h, 1d"}),
]
"""A duration written as ``90s``, ``10m``, ``24h`` or ``1d``."""

Quantity = Annotated[
    float,
    BeforeValidator(parse_quantity),
    WithJsonSchema({**_INT_OR_STRING, "description": "Kubernetes quantity: 2, 500m, 4Gi"}),
]
"""A Kubernetes quantity, stored as a plain number (cores or bytes)."""


def _to_utc(value: datetime) -> datetime:
    return as_utc(value)  # one argument: pydantic would pass its ValidationInfo as as_utc's second


UtcDatetime = Annotated[
    AwareDatetime,
    AfterValidator(_to_utc),
    PlainSerializer(iso, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""An ISO-8601 instant with a time zone, normalised to UTC."""
