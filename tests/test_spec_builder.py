"""The tests' one spec builder (tests/fixtures/specs.py): what it builds is a valid job, its
keywords change only what they name, and its demo is the shipped demo."""

from __future__ import annotations

import pytest
import yaml

from primus_lib.spec import SpecError, load_job
from tests.fixtures.specs import DEMO, airflow_doc, batch_stream, demo_doc, job_doc, kafka_stream, load, write_spec

ENV = {"PRIMUS_DATA": "/data"}


def test_the_demo_preset_is_the_shipped_demo_job():
    """Tests of "the demo" follow config/jobs/ctr-demo.yaml: a change there fails here, not silently."""
    assert demo_doc() == yaml.safe_load(DEMO.read_text())


def test_every_preset_is_a_valid_job_and_survives_its_yaml(tmp_path):
    for doc in (job_doc(), airflow_doc(), demo_doc()):
        job = load(doc, ENV)
        assert load_job(write_spec(tmp_path / f"{job.name}.yaml", doc), ENV) == job
        assert load_job(write_spec(tmp_path / "again.yaml", job), {}) == job  # a loaded job, as validated


def test_keywords_change_what_they_name_and_nothing_else():
    base, changed = job_doc(), job_doc(hours=2, mode="offline", batch_size=16, sharding="dmp")
    assert changed["spec"]["timer"]["end"] == "2026-11-01T02:00:00Z"
    assert changed["spec"]["training"] == {
        **base["spec"]["training"],
        "mode": "offline",
        "batch_size": 16,
        "sharding": "dmp",
    }
    assert {k: v for k, v in changed["spec"].items() if k not in ("timer", "training")} == {
        k: v for k, v in base["spec"].items() if k not in ("timer", "training")
    }
    online = load(job_doc(lag="1h", stream=kafka_stream("k:9092", "t"), mode="online"), ENV)
    assert (
        online.stream("history").lag.total_seconds() == 3600 and online.stream("realtime").sources[0].kafka.topic == "t"
    )
    assert "scaling" not in job_doc(scaling=None)["spec"]  # None: the section left out (the spec's defaults)


def test_a_built_document_is_never_shared_with_the_next():
    first = job_doc()
    first["spec"]["features"]["sparse"][0]["buckets"] = 1
    first["spec"]["dataset"]["streams"][0]["sources"][0]["uri"] = "s3://elsewhere/"
    assert job_doc()["spec"]["features"]["sparse"][0]["buckets"] == 2000
    assert job_doc() == job_doc() and batch_stream()["sources"][0]["uri"].startswith("file://${PRIMUS_DATA}/")


def test_an_unchecked_job_skips_only_the_cross_field_checks():
    roles = {"trainer": {"command": ["x"]}}  # no image for yarn, no data_executor with scaling on
    with pytest.raises(SpecError, match="image"):
        load(demo_doc(backend="yarn", roles=roles), ENV)
    job = load(demo_doc(backend="yarn", roles=roles), ENV, check=False)
    assert job.spec.resources.backend == "yarn" and job.stream("history").sources[0].uri.startswith("file:///data/")
    assert job.spec.airflow.poll_interval.total_seconds() == 30  # ${PRIMUS_POLL_INTERVAL:-30s}
