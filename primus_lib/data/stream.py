"""The interface between stream sources (Kafka, file replay) and their consumers (stream
executors, the trainer's reader). A position is a mapping of partition -> next offset; it is
stored in checkpoints and committed to the broker only after the checkpoint that covers it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import pyarrow as pa

Position = Mapping[str, int]
"""Partition name (e.g. ``"ctr-events/3"`` or a replay file) -> next offset to read."""


class StreamReader(ABC):
    """Reads one stream source as Arrow record batches in the sample schema."""

    @abstractmethod
    def poll(self, max_rows: int, timeout: float) -> pa.RecordBatch | None:
        """Up to ``max_rows`` decoded samples, or None when nothing arrived within ``timeout``."""

    @abstractmethod
    def position(self) -> dict[str, int]:
        """The offsets just past the rows returned so far."""

    @abstractmethod
    def seek(self, position: Position) -> None:
        """Resume from a checkpointed position."""

    def commit(self, position: Position) -> None:  # noqa: B027 - optional for sources without a broker
        """Make ``position`` durable at the source (Kafka: commit offsets to the group)."""

    def end_of_data(self) -> bool:
        """True when a bounded replay has nothing left; a live stream never ends."""
        return False

    def close(self) -> None:  # noqa: B027
        """Release connections."""

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
