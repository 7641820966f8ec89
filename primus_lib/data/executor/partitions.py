"""The Kafka partitions of a stream, in the order stream executors and the trainer's reader deal them.

The order is (partition number, source): Kafka only ever adds partitions with higher numbers, so
a partition added to a one-source stream while it runs lands at the end of the order, and an
executor started after the addition lists the partitions in the same order as one started before
(the trainer's reader deals every n-th partition of it; see ``flight_client.py``).
"""

from __future__ import annotations

from confluent_kafka import Consumer

from primus_lib.data.sources.kafka import LoginWatch, client_config, login_description
from primus_lib.spec.job import PrimusJob


def stream_partitions(job: PrimusJob, stream_name: str) -> list[tuple[int, int]]:
    """(source index, partition) of every Kafka partition of the stream, in dealing order."""
    stream = job.stream(stream_name)
    found = []
    for i, source in enumerate(stream.sources):
        if source.kafka is None:
            raise ValueError(
                f"stream {stream_name!r} source {source.name!r}: stream executors serve Kafka sources only"
            )
        client = client_config(stream, source)
        login = LoginWatch(login_description(stream, source, client["bootstrap.servers"]))
        consumer = Consumer({**client, "group.id": "primus-metadata", "error_cb": login})
        try:
            topic = source.kafka.topic
            meta = login.first_metadata(consumer, topic).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise RuntimeError(f"topic {topic!r} not found ({getattr(meta, 'error', None)})")
            found += [(i, p) for p in meta.partitions]
        finally:
            consumer.close()
    return in_order(found)


def in_order(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(set(pairs), key=lambda sp: (sp[1], sp[0]))


def owned(partitions: list[tuple[int, int]], index: int, replicas: int) -> list[tuple[int, int]]:
    """Executor ``index``'s start-up share: every ``replicas``-th partition."""
    if not 0 <= index < replicas:
        raise ValueError(f"executor index {index} out of range for {replicas} replicas")
    return partitions[index::replicas]
