"""A data task: the data of one source in one window, small enough for one executor slot.

Frozen and JSON-serialisable (it travels through Airflow XCom and the ledger).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class DataTask:
    id: str
    stream: str
    source: str
    window: str  # window id, YYYYMMDDTHHMMSSZ of its start
    uri: str  # the file, with scheme
    path: str  # the file inside its filesystem
    format: str
    size: int  # bytes of the whole file
    offset: int = 0  # byte range [offset, offset + length) of this split; row groups starting in it
    length: int | None = None  # None: the whole file
    split: int = 0
    splits: int = 1

    @classmethod
    def fast(cls, **values) -> DataTask:
        """Build without the per-field frozen ``__setattr__`` of ``__init__`` (the planner makes
        millions); the caller passes every field."""
        task = object.__new__(cls)
        object.__setattr__(task, "__dict__", values)
        return task

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> DataTask:
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"DataTask: unknown fields {sorted(unknown)}")
        return cls(**raw)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> DataTask:
        raw = json.loads(text)
        if raw.keys() == _FIELDS:
            return cls.fast(**raw)
        return cls.from_dict(raw)


_FIELDS = {f.name for f in fields(DataTask)}
