"""The base of every spec model: unknown fields are errors (they are usually typos), and so
are NaN and infinite numbers (they pass every bound check)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)
