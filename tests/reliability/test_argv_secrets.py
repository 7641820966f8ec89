"""No secret in any process's argv while a job's roles run as the demo runs them: the local
backend's supervisor starts two stream executors (``primus executor``: Kafka -> Arrow Flight) and
the trainer (``primus train``), state on S3 (a private SeaweedFS with keys of its own), Kafka
settings with SASL credentials from the connection variable the Airflow hooks fill, and the job's
Flight token made by the roles themselves. Every process's command line is sampled (psutil,
every 0.2 s) from before the job starts until its roles are stopped, while the trainer trains the
stream through the executors; none holds the S3 secret key, the SASL password or the Flight token,
and neither do the roles' logs. (``test_secrets.py`` does the same around ``primus backfill`` and
a real Airflow.)"""

from __future__ import annotations

import re
import secrets
import sys
import uuid
from pathlib import Path

import pytest

from primus_lib.cli.main import main
from primus_lib.paths import JobPaths
from primus_lib.spec import load_job
from primus_lib.storage import locate
from tests.fixtures import connections
from tests.fixtures._proc import stop
from tests.fixtures.s3 import start_seaweedfs
from tests.fixtures.specs import ROLES, job_doc, kafka_stream
from tests.reliability.argv import ArgvSampler
from tests.train.conftest import write_job
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.s3]
TOKEN_NAME = ".flight-token"
SAMPLES = re.compile(r"^primus_trainer_samples_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def _objects(root) -> dict[str, bytes]:
    """Every object under a storage location, by URI."""
    found = {}
    for entry in root.list():
        if entry.is_dir:
            found.update(_objects(root / entry.name))
        else:
            found[str(root / entry.name)] = (root / entry.name).read_bytes()
    return found


def _trained(job) -> float:
    """Samples the trainer reports trained (its metric snapshot on S3), 0 before the first one."""
    snapshot = JobPaths.for_job(job).metrics_dir / "trainer-0.prom"
    try:
        text = snapshot.read_text()
    except (FileNotFoundError, OSError):
        return 0.0
    return sum(float(v) for v in SAMPLES.findall(text))


def test_the_demo_roles_never_carry_a_secret_in_argv(kafka_broker, tmp_path, monkeypatch):
    from primus_lib.resources import backend_for
    from primus_lib.resources.table import read_json, resources_dir

    access, secret = f"AK{secrets.token_hex(8)}", f"SK{secrets.token_hex(16)}"
    sasl = kafka_broker.login.password  # the broker asks for it: the roles cannot read the stream without it
    (tmp_path / "s3").mkdir()
    weed, s3_url = start_seaweedfs(tmp_path / "s3", access, secret)
    backend = None
    try:
        bucket = f"primus-{uuid.uuid4().hex[:8]}"
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        # the connections as mounted secret files: the store (the default storage connection) and the
        # Kafka source's SASL login
        s3 = {"conn_type": "aws", "login": access, "password": secret, "extra": {"endpoint_url": s3_url}}
        kafka = kafka_broker.connection()
        connections.mount(monkeypatch, tmp_path / "secrets", {"primus_storage_default": s3, "events_sasl": kafka})
        import pyarrow.fs as pafs

        pafs.S3FileSystem(
            access_key=access,
            secret_key=secret,
            endpoint_override=s3_url.split("//")[1],
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        ).create_dir(bucket)
        topic = kafka_broker.new_topic(partitions=2, prefix="argv")
        stream = kafka_stream(kafka_broker.bootstrap, topic, connection_id="events_sasl")
        # the trainer at the demo's 2Gi: its RSS peaked at 0.82 GiB here alone and passed 1Gi beside a
        # CPU hog (the supervisor kills a worker over its limit: exit 137, three restarts, no training)
        trainer = {**ROLES["trainer"], "memory": "2Gi"}
        roles, storage = {"trainer": trainer, "stream_executor": {"replicas": 2}}, {"root": f"s3://{bucket}/jobs"}
        doc = job_doc(hours=2, lag="1h", stream=stream, mode="online", roles=roles, storage=storage)
        spec = write_job(tmp_path, monkeypatch, doc, "kafka.yaml")
        generated = main(
            ["datagen", str(spec), "--rows-per-hour", "200", "--seed", "4", "--kafka", kafka_broker.bootstrap]
        )
        assert generated == 0
        job = load_job(spec)
        with ArgvSampler(every=0.2) as argv:
            backend = backend_for(job, str(spec))
            backend.submit()
            trained = wait_for(
                "the trainer trains the stream through both executors", lambda: _trained(job), timeout=300, interval=1.0
            )
            # the roles' secret files (a mounted Secret): private, in memory, outside the job's state
            secrets_dir = Path(read_json(resources_dir(job) / "supervisor.json")["secrets"])
            mounted = {p: p.stat().st_mode for p in secrets_dir.iterdir()}
            backend.stop()
        state = _objects(locate(f"s3://{bucket}/jobs"))
        tokens = {k: v.decode().strip() for k, v in state.items() if k.endswith(TOKEN_NAME)}
        assert len(tokens) == 1 and len(next(iter(tokens.values()))) >= 16, sorted(state)  # the roles made one
        known = {
            "S3 secret key": secret,
            "S3 access key": access,
            "Kafka SASL password": sasl,
            "Flight token": next(iter(tokens.values())),
        }

        assert trained > 0
        assert argv.saw("primus_lib.resources.supervisor") and argv.saw("primus_lib.cli.main", "train", str(spec))
        executors = {cmd for cmd in argv.seen if "executor" in cmd and str(spec) in cmd}
        assert len(executors) >= 1 and argv.samples >= 25, (executors, argv.samples)
        leaks = argv.leaks(known)
        assert not leaks, "\n".join(leaks)
        assert mounted and all(mode & 0o077 == 0 for mode in mounted.values()), mounted
        assert not secrets_dir.is_relative_to(tmp_path) and not secrets_dir.exists(), secrets_dir  # gone at stop
        files = [p for p in (tmp_path / "home").rglob("*") if p.is_file()]
        logs = {str(p): p.read_bytes() for p in files}
        logs.update({k: v for k, v in state.items() if not k.endswith(TOKEN_NAME)})
        assert any(k.endswith(".log") for k in logs), sorted(logs)  # the role logs were searched
        found = [
            f"{what} in {where}"
            for where, data in logs.items()
            for what, value in known.items()
            if what != "S3 access key" and value.encode() in data
        ]
        assert not found, "\n".join(found)
    finally:
        if backend is not None:
            backend.stop()
        stop(weed)
    print(
        f"\n{argv.samples} samples of every process's argv, {len(argv.seen)} distinct command lines, "
        f"{trained:.0f} samples trained; {len(logs)} local files and S3 objects searched",
        file=sys.stderr,
    )
