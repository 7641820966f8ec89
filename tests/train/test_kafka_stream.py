"""`primus datagen --kafka` into a real Apache Kafka broker (KRaft), trained by the trainer
through the data plane's KafkaStreamReader; offsets reach the group only after checkpoints."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from primus_lib.cli.main import main
from primus_lib.data.sources import open_stream
from primus_lib.data.sources.kafka import default_group
from primus_lib.paths import JobPaths
from primus_lib.spec import load_job
from primus_lib.train.runtime.feeds import StreamFeed
from primus_lib.train.runtime.trainer import Trainer, TrainerOptions
from tests.fixtures.specs import job_doc, kafka_stream
from tests.train.conftest import commit_windows, write_job

pytestmark = pytest.mark.integration


def test_datagen_to_kafka_then_online_training(kafka_broker, tmp_path, monkeypatch, capsys):
    topic = kafka_broker.new_topic(partitions=1, prefix="ctr")
    doc = job_doc(hours=2, lag="1h", stream=kafka_stream(kafka_broker.bootstrap, topic), mode="online")
    spec = write_job(tmp_path, monkeypatch, doc, "kafka.yaml")
    assert main(["datagen", str(spec), "--rows-per-hour", "100", "--seed", "2", "--kafka", kafka_broker.bootstrap]) == 0
    produced = int(capsys.readouterr().out.split("; ")[-1].split()[0])
    events = (tmp_path / "data" / "stream" / "events.jsonl").read_text().splitlines()
    assert produced == len(events) > 100

    job = load_job(spec)
    trainer = Trainer(job, TrainerOptions(poll_interval=0.05, idle_exit=4, checkpoint_steps=1))
    trainer.run()
    buffer = trainer.reader.buffers["realtime"]
    assert trainer.reader.served["realtime"] + buffer.rows == len(events)  # a live stream: the remainder waits
    assert trainer.reader.served["realtime"] >= 64 * (len(events) // 64)

    # the group's committed offset is the checkpointed position (pending rows are in the checkpoint)
    progress = json.loads(JobPaths.for_job(job).progress.read_text())
    checkpointed = progress["stream_position"]["realtime"][0]["offsets"][f"{topic}/0"]
    consumer = Consumer(kafka_broker.config({"group.id": default_group(job, job.stream("realtime"))}))
    try:
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()
    assert committed == checkpointed == len(events)


def test_mtrm_with_a_finished_topic_still_trains_every_batch_window(kafka_broker, tmp_path, monkeypatch, capsys):
    """The demo's situation: the topic holds two finished days; the stream never passes the
    last windows + lag by event time, but it has caught up, so the clock releases them."""

    topic = kafka_broker.new_topic(partitions=1, prefix="ctr")
    doc = job_doc(hours=2, lag="1h", stream=kafka_stream(kafka_broker.bootstrap, topic), mode="mtrm")
    spec = write_job(tmp_path, monkeypatch, doc, "kafka.yaml")
    assert main(["datagen", str(spec), "--rows-per-hour", "100", "--seed", "3", "--kafka", kafka_broker.bootstrap]) == 0
    job = load_job(spec)
    sizes = commit_windows(job, range(2))
    summary = Trainer(job, TrainerOptions(until_window="20261101T010000Z", poll_interval=0.05, idle_exit=20)).run()
    consumed = json.loads(JobPaths.for_job(job).progress.read_text())["consumed"]
    assert [consumed.get(f"history/20261101T0{h}0000Z", {}).get("samples") for h in range(2)] == sizes, summary


def test_an_empty_poll_over_a_backlog_is_not_the_live_edge(kafka_broker, tmp_path, monkeypatch, capsys):
    """A reader's first polls find nothing while its fetch is in flight. The trainer must not
    take that for "caught up" (the clock would then release batch windows the stream has not
    reached): the feed asks the reader's high watermarks, and only a drained reader is caught up."""
    topic = kafka_broker.new_topic(partitions=1, prefix="ctr")
    doc = job_doc(hours=2, lag="1h", stream=kafka_stream(kafka_broker.bootstrap, topic), mode="mtrm")
    spec = write_job(tmp_path, monkeypatch, doc, "kafka.yaml")
    assert main(["datagen", str(spec), "--rows-per-hour", "100", "--seed", "4", "--kafka", kafka_broker.bootstrap]) == 0
    lines = (tmp_path / "data" / "stream" / "events.jsonl").read_text().splitlines()
    job = load_job(spec)
    stream = job.stream("realtime")
    feed = StreamFeed("realtime", open_stream(job, stream, stream.sources[0]), job.spec.features.timestamp)
    try:
        # an empty poll over a backlog, made certain: on a loaded machine the first fetch may
        # already have answered by the first poll (the case this test used to rely on)
        partition = [TopicPartition(topic, 0)]
        feed.reader.consumer.pause(partition)
        assert feed.read(64, 0.0) is None and not feed.caught_up  # nothing returned: not the edge
        feed.reader.consumer.resume(partition)
        assert feed.reader.lag() == {f"{topic}/0": len(lines)}

        def drain() -> int:
            rows, deadline = 0, time.monotonic() + 20
            while time.monotonic() < deadline:
                table = feed.read(64, 0.2)
                if table is None and feed.caught_up:
                    return rows
                rows += 0 if table is None else table.num_rows
            raise AssertionError(f"not caught up after {rows} rows")

        assert drain() == len(lines) and feed.reader.lag() == {f"{topic}/0": 0}
        kafka_broker.produce(topic, [line.encode() for line in lines[:5]], partition=0)
        assert feed.reader.lag() == {f"{topic}/0": 5}  # the broker's watermark, at once
        deadline = time.monotonic() + 10
        while feed.reader.at_live_edge():  # the consumer's next fetch response moves its own
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert drain() == 5
    finally:
        feed.reader.close()
