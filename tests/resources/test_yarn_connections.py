"""The job's connections on YARN (primus_lib/resources/yarn/staging.py): the submitter writes the
connections it resolves to a private directory on the cluster's HDFS, every worker's application
lists it as a LocalResource the NodeManager localizes into the container, and the worker's
``PRIMUS_SECRETS_DIR`` names that copy, never the submitter's directory. Unit tests of the
submission context first, then one job on the real MiniYARNCluster and its HDFS
(tests/fixtures/hadoop.py)."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import psutil
import pytest

from primus_lib.credentials import Connection, write_secret_files
from primus_lib.resources.base import ResourceError
from primus_lib.resources.yarn import YarnBackend, YarnClient
from primus_lib.resources.yarn.am import command_environment
from primus_lib.resources.yarn.client import submission_context
from primus_lib.resources.yarn.staging import STAGING_DIR, Staged, hdfs_addresses, worker_environment
from tests.fixtures.specs import DATA, batch_stream, demo_doc, kafka_stream, load, write_spec
from tests.resources.conftest import py
from tests.resources.test_yarn import wait_for

SECRET_KEY = "lake-secret-7c41e9"  # the connection's password: in the submitter's files and on HDFS only
LAKE = Connection("lake", "aws", login="AKIALAKE", password=SECRET_KEY, extra={"endpoint_url": "http://s3.lake:8333"})
STAGED = Staged("hdfs://nn:8020", "http://nn:9870", "/user/u/.primus-staging/j-0a1b", 0, 1796311638201)


# -- unit tests: no server ----------------------------------------------------------------------
def _context(env: dict[str, str], staged: Staged | None) -> dict:
    return submission_context(
        "application_1_0001",
        "j-trainer-0",
        ["python", "-c", "pass"],
        1,
        2**30,
        "default",
        ["primus-job:j"],
        worker_environment(env, ("PRIMUS_",), staged),
        1,
        "/venv/bin/python",
        local_resources=[staged.local_resource()] if staged else None,
    )


def test_the_submission_context_lists_the_staged_connections_and_not_the_submitters_directory():
    caller = {"PRIMUS_HOME": "/h", "PRIMUS_SECRETS_DIR": "/submitter/secrets", "HOME": "/root"}
    spec = _context(caller, STAGED)["am-container-spec"]
    assert spec["local-resources"] == {
        "entry": [
            {
                "key": "primus-secrets",
                "value": {
                    "resource": "hdfs://nn:8020/user/u/.primus-staging/j-0a1b",
                    "type": "FILE",
                    "visibility": "APPLICATION",
                    "size": 0,
                    "timestamp": 1796311638201,
                },
            }
        ]
    }
    env = {e["key"]: e["value"] for e in spec["environment"]["entry"]}
    assert env == {"PRIMUS_HOME": "/h", "PRIMUS_SECRETS_DIR": "primus-secrets"}  # relative: the AM resolves it
    assert "/submitter/secrets" not in json.dumps(spec)

    bare = _context(caller, None)["am-container-spec"]  # nothing resolvable: no resource, no variable
    assert "local-resources" not in bare
    assert {e["key"] for e in bare["environment"]["entry"]} == {"PRIMUS_HOME"}


def test_the_clusters_hdfs_comes_from_its_default_fs_and_namenode_http_address():
    assert hdfs_addresses("hdfs://nn:8020", "nn.web:9870") == ("hdfs://nn:8020", "http://nn.web:9870")
    assert hdfs_addresses("hdfs://nn:8020/", "0.0.0.0:50070") == ("hdfs://nn:8020", "http://nn:50070")
    assert hdfs_addresses("hdfs://nn:8020", None) == ("hdfs://nn:8020", "http://nn:9870")  # Hadoop's default
    for default_fs in ("file:///", None, "s3a://bucket"):
        with pytest.raises(ResourceError, match="fs.defaultFS .*expected hdfs://NAMENODE:PORT"):
            hdfs_addresses(default_fs, "nn:9870")


def test_the_am_hands_the_command_its_localized_secrets_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the container's working directory
    monkeypatch.setenv("PRIMUS_SECRETS_DIR", "primus-secrets")
    assert command_environment()["PRIMUS_SECRETS_DIR"] == str(tmp_path / "primus-secrets")
    monkeypatch.setenv("PRIMUS_SECRETS_DIR", "/run/secrets")
    assert command_environment()["PRIMUS_SECRETS_DIR"] == "/run/secrets"
    monkeypatch.delenv("PRIMUS_SECRETS_DIR")
    assert "PRIMUS_SECRETS_DIR" not in command_environment()


# -- the real cluster -----------------------------------------------------------------------------
# The worker resolves the connection as any role does and writes what it found, not the secret.
READER = r"""
import hashlib, json, os, pathlib, time
from primus_lib.credentials import current
found = current().storage("lake")
where = os.environ["PRIMUS_SECRETS_DIR"]
report = {"login": found.access_key_id, "endpoint": found.endpoint_url, "pid": os.getpid(), "cwd": os.getcwd(),
          "secret_sha256": hashlib.sha256(found.secret_access_key.encode()).hexdigest(), "secrets_dir": where,
          "mode": oct(os.stat(os.path.join(where, "lake.json")).st_mode & 0o777)}
out = pathlib.Path(OUT)
(out / "found.tmp").write_text(json.dumps(report))
os.replace(out / "found.tmp", out / "found.json")
time.sleep(600)
"""


def _job(tmp_path: Path, rm_url: str, out: Path) -> YarnBackend:
    """A worker of our own that reads the connection ``lake``, which the job names (a batch source's)."""
    roles = {
        "data_executor": {"replicas": 1},
        "stream_executor": {
            "replicas": 1,
            "memory": "128Mi",
            "max_restarts": 0,
            "command": py(f"OUT = {str(out)!r}\n" + READER),
        },
    }
    doc = demo_doc(
        roles={name: {"image": "primus-trainer:latest", **spec} for name, spec in roles.items()},
        backend="yarn",
        name=f"yc-{uuid.uuid4().hex[:8]}",
        resources={"clusters": [{"name": "mini", "backend": "yarn", "resource_manager": rm_url}]},
        streams=[batch_stream(DATA, lag="24h", connection_id="lake"), kafka_stream("127.0.0.1:19092", "t")],
    )
    job = load(doc, check=False)
    return YarnBackend(job, str(write_spec(tmp_path / "job.yaml", job)))


def _staged(hdfs, home: str, job: str) -> dict[str, dict]:
    """The job's directories in the staging area: name -> (its status, its files' statuses)."""
    try:
        entries = hdfs.rest(f"{home}/{STAGING_DIR}", "LISTSTATUS")["FileStatuses"]["FileStatus"]
    except OSError:  # 404: no staging area yet
        return {}
    out = {}
    for entry in entries:
        if entry["pathSuffix"].startswith(f"{job}-"):
            files = hdfs.rest(f"{home}/{STAGING_DIR}/{entry['pathSuffix']}", "LISTSTATUS")["FileStatuses"]
            out[entry["pathSuffix"]] = {"dir": entry, "files": {f["pathSuffix"]: f for f in files["FileStatus"]}}
    return out


def _found(out: Path, other_than: int | None = None) -> dict | None:
    path = out / "found.json"
    report = json.loads(path.read_text()) if path.exists() else None
    return report if report and report["pid"] != other_than else None


def test_a_worker_reads_the_connections_the_submitter_staged_on_hdfs(yarn_cluster, job_env, tmp_path, monkeypatch):
    submitter = write_secret_files(tmp_path / "submitter-secrets", [LAKE])
    monkeypatch.setenv("PRIMUS_SECRETS_DIR", str(submitter))  # the submitting host's own directory
    out = tmp_path / "out"
    out.mkdir()
    backend = _job(tmp_path, yarn_cluster.rm_url, out)
    rm, hdfs, name = YarnClient(yarn_cluster.rm_url), yarn_cluster.hdfs, backend.job.name
    home = f"/user/{backend.client.user}"  # the YARN user's HDFS home
    try:
        backend.submit()
        found = wait_for(lambda: _found(out), 60, "the worker's report")
        assert found["login"] == "AKIALAKE" and found["endpoint"] == "http://s3.lake:8333"
        assert found["secret_sha256"] == hashlib.sha256(SECRET_KEY.encode()).hexdigest()
        # the NodeManager's localized copy in the container's working directory, owner-only on the node
        assert found["secrets_dir"] == os.path.join(found["cwd"], "primus-secrets")
        assert int(found["mode"], 8) & 0o077 == 0
        worker = psutil.Process(found["pid"])
        assert str(submitter) not in json.dumps(worker.environ())  # the submitter's directory: not passed
        assert worker.parent().environ()["PRIMUS_SECRETS_DIR"] == "primus-secrets"  # the AM's, from the context

        # on HDFS while the job runs: one private directory of this job, owner-only
        staged = _staged(hdfs, home, name)
        assert len(staged) == 1, staged
        ((first, copy),) = staged.items()
        assert (copy["dir"]["permission"], copy["dir"]["owner"]) == ("700", backend.client.user)
        assert {k: f["permission"] for k, f in copy["files"].items()} == {"lake.json": "600"}

        # no secret in the RM's application report, the container logs or the cluster's log
        (app,) = rm.apps(f"primus-job:{name}")
        report = json.dumps(yarn_cluster.get(f"/ws/v1/cluster/apps/{app['id']}"))
        assert SECRET_KEY not in report and str(submitter) not in report
        logs = [p for p in Path(yarn_cluster.base_dir).rglob("std*") if p.is_file() and p.name in ("stdout", "stderr")]
        assert logs and not [p for p in logs if SECRET_KEY in p.read_text(errors="replace")]
        assert SECRET_KEY not in Path(yarn_cluster.log).read_text(errors="replace")

        # the submitter dies without stop(); the worker ends. A new submission stages a fresh copy of
        # the connections as resolved now (rotated) and removes the stale one
        rm.kill(app["id"])
        wait_for(lambda: rm.app(app["id"])["state"] == "KILLED", 30, "the killed application")
        rotated = "lake-secret-rotated-11"
        write_secret_files(submitter, [Connection("lake", "aws", login="AKIALAKE", password=rotated)])
        backend.submit()
        again = wait_for(lambda: _found(out, other_than=found["pid"]), 60, "the new worker's report")
        assert again["secret_sha256"] == hashlib.sha256(rotated.encode()).hexdigest()
        assert list(_staged(hdfs, home, name)) != [first] and len(_staged(hdfs, home, name)) == 1
    finally:
        backend.stop()
    assert _staged(hdfs, home, name) == {}  # gone with the job
