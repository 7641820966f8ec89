"""Data sources behind one interface: batch files (planned by DTGG, read per task) and streams.

Every stream source implements :class:`primus_lib.data.stream.StreamReader`; open one with
:func:`open_stream` (Kafka for a ``kafka`` block, an event-time replay for a ``uri``).
"""

from __future__ import annotations

from primus_lib.data.stream import StreamReader
from primus_lib.spec.dataset import SourceSpec, StreamSpec
from primus_lib.spec.job import PrimusJob

__all__ = ["open_partitions", "open_stream"]


def open_stream(
    job: PrimusJob,
    stream_spec: StreamSpec,
    source_spec: SourceSpec,
    *,
    group_id: str | None = None,
    partitions: list[int] | None = None,
) -> StreamReader:
    """A reader of one stream source: ``partitions`` picks topic-partitions (one stream task each)."""
    if source_spec.kafka is not None:
        from primus_lib.data.sources.kafka import KafkaStreamReader

        return KafkaStreamReader(job, stream_spec, source_spec, group_id=group_id, partitions=partitions)
    if source_spec.uri is not None:
        from primus_lib.data.sources.replay import ReplayStreamReader

        if partitions not in (None, [0]):
            raise ValueError(
                f"source {source_spec.name!r}: a file replay has one partition (0), asked for {partitions}"
            )
        return ReplayStreamReader(job, stream_spec, source_spec)
    raise ValueError(f"source {source_spec.name!r} of stream {stream_spec.name!r}: neither kafka nor uri")


def open_partitions(
    job: PrimusJob, stream_spec: StreamSpec, source_spec: SourceSpec, *, group_id: str | None = None
) -> dict[str, StreamReader]:
    """One reader per partition (one stream task each), keyed by partition name (``topic/p``)."""
    if source_spec.kafka is None:
        return {f"replay/{source_spec.name}": open_stream(job, stream_spec, source_spec)}
    from confluent_kafka import Consumer

    from primus_lib.data.sources.kafka import LoginWatch, client_config, login_description, partition_key

    topic = source_spec.kafka.topic
    client = client_config(stream_spec, source_spec)
    login = LoginWatch(login_description(stream_spec, source_spec, client["bootstrap.servers"]))
    probe = Consumer({**client, "group.id": "primus-probe", "error_cb": login})
    try:
        meta = login.first_metadata(probe, topic).topics.get(topic)
    finally:
        probe.close()
    if meta is None or meta.error is not None or not meta.partitions:
        raise ValueError(f"topic {topic!r} not found at {client['bootstrap.servers']}")
    return {
        partition_key(topic, p): open_stream(job, stream_spec, source_spec, group_id=group_id, partitions=[p])
        for p in sorted(meta.partitions)
    }
