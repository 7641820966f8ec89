"""A block of messages from a librdkafka consumer, and each message's partition and offset.

Behind the stream (a backlog) a block is what is queued, taken at once: ``consume(n, timeout)``
waits until it has all ``n``, and a count that did not divide the fetched message sets waited
~40 ms a call (bench/stream.py: 8,192 a call read 0.17 M rows/s, this 1.1 M). At the live edge,
where little is queued, a block waits out the poll's timeout to fill, as ``consume`` did: a block
of a few rows costs an executor as much as one of thousands (bench/scaling.py: executors at 650
rows/s went from 65% to 95% of their CPU when every message was a block).
"""

from __future__ import annotations

import time
from typing import cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message


def fetch_block(consumer: Consumer, max_rows: int, timeout: float) -> list[Message]:
    """Up to ``max_rows`` messages (error events among them) within ``timeout``."""
    began = time.monotonic()
    first = consumer.poll(timeout)
    if first is None:
        return []
    messages = [first, *consumer.consume(max_rows - 1, 0)] if max_rows > 1 else [first]
    left = timeout - (time.monotonic() - began)
    if len(messages) < max(1, max_rows // 8) and left > 0:  # the live edge: fill the block for a while
        messages += consumer.consume(max_rows - len(messages), left)
    return messages


def block_fields(
    messages: list[Message], topic: str, keys: dict[int, str]
) -> tuple[list[Message], list[str], list[int]]:
    """The messages of ``topic``'s partitions in ``keys`` (partition -> its key), with the key and
    offset of each; error events are set aside (a fatal or non-retriable one is raised). One C call
    per message and field, list by list: a loop over the messages cost 1.3 us a row."""
    if any([msg.error() for msg in messages]):  # events among the messages (end of a partition...)
        messages = _without_events(messages)
    topics, partitions = [msg.topic() for msg in messages], [msg.partition() for msg in messages]
    offsets = [msg.offset() for msg in messages]
    if None in offsets or None in partitions:  # unset only on error events
        raise RuntimeError(f"kafka {topic}: a fetched message without partition or offset")
    named = cast(dict[int | None, str], keys)
    found = [named.get(p) for p in partitions]
    if None in found or topics.count(topic) != len(topics):  # fetched before a reassign dropped its partition
        kept = [i for i, (t, k) in enumerate(zip(topics, found, strict=True)) if k is not None and t == topic]
        messages, found, offsets = [messages[i] for i in kept], [found[i] for i in kept], [offsets[i] for i in kept]
    return messages, cast(list[str], found), cast(list[int], offsets)  # the Nones were dropped above


def _without_events(messages: list[Message]) -> list[Message]:
    kept = []
    for msg in messages:
        err = msg.error()
        if err is None:
            kept.append(msg)
        elif err.code() != KafkaError._PARTITION_EOF and (err.fatal() or not err.retriable()):
            raise KafkaException(err)
    return kept
