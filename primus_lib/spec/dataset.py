"""The three data tiers: a Dataset holds DataStreams, each mixing DataSources."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import Field

from primus_lib.spec.base import SpecModel
from primus_lib.spec.types import Duration, UtcDatetime

StartupMode = Literal["group_offsets", "earliest", "latest", "timestamp"]
FileFormat = Literal["parquet", "csv", "jsonl", "json"]


class KafkaSpec(SpecModel):
    """Where a stream source reads. Credentials come from a connection (``connection_id``), never here."""

    bootstrap_servers: str = Field(min_length=1)
    topic: str = Field(min_length=1)
    group_id: str | None = Field(None, description="Consumer group; default primus-<job>-<stream>.")
    startup: StartupMode = "group_offsets"
    startup_timestamp: UtcDatetime | None = Field(None, description="Required when startup is 'timestamp'.")
    connection_id: str | None = Field(
        None,
        description="Connection holding client settings (SASL login, librdkafka config): an Airflow connection "
        "in Airflow's tasks, $PRIMUS_SECRETS_DIR/<id>.json in a role's process.",
    )
    options: dict[str, str] = Field(default_factory=dict, description="Extra librdkafka settings.")


class SourceSpec(SpecModel):
    """One period of data in one storage system plus how to decode it."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    uri: str | None = Field(
        None,
        description="Path template with {YYYY} {MM} {DD} {HH} placeholders: file://, s3://, hdfs://, webhdfs://.",
    )
    kafka: KafkaSpec | None = None
    format: FileFormat = "parquet"
    file_pattern: str = Field("*", description="Glob the data files' names must match.")
    success_marker: str | None = Field(None, description="File that says a partition is complete.")
    start: UtcDatetime | None = Field(None, description="First instant this source has data for.")
    end: UtcDatetime | None = Field(None, description="Last instant (exclusive); none = open.")
    split_bytes: int | None = Field(None, gt=0, description="Split files larger than this into several tasks.")
    columns: dict[str, str] = Field(
        default_factory=dict, description="Renames: sample column -> column in this source."
    )
    connection_id: str | None = Field(
        None,
        description="Connection for the storage's credentials (as spec.storage.connection_id); default: "
        "primus_storage_default when there is one of the URI's kind.",
    )


class JoinSpec(SpecModel):
    """How the sources of a stream are joined on their keys (the first source is the left side)."""

    keys: list[str] = Field(min_length=1)
    how: Literal["left", "inner", "outer"] = "left"
    fill: dict[str, Any] = Field(default_factory=dict, description="Values for columns the join left empty.")


class StreamSpec(SpecModel):
    """A mix of sources on a sliding time window, either bounded batch or unbounded stream."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    kind: Literal["batch", "stream"]
    lag: Duration = Field(timedelta(0), description="Batch data of a window is complete this much later.")
    sources: list[SourceSpec] = Field(min_length=1)
    join: JoinSpec | None = None
    shuffle: Literal["forward", "rebalance"] = Field(
        "forward", description="Stream loading: own partitions only, or hand data between executors."
    )
    rows_per_shard: int = Field(65536, gt=0, description="Rows per committed Arrow shard (batch).")


class DatasetSpec(SpecModel):
    streams: list[StreamSpec] = Field(min_length=1)
    serving: Literal["together", "sequential"] = Field(
        "together", description="Serve the streams together (priority-mixed) or one after another."
    )
