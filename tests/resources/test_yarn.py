"""The YARN backend's requests to the ResourceManager REST API, against a FAKE RM (tests/fake_http.py):
no YARN can be installed here, so this checks request construction and state handling only."""

from __future__ import annotations

import itertools

import pytest

from primus_lib.resources import backend_for
from primus_lib.resources.base import ResourceError
from primus_lib.resources.yarn import YarnBackend, YarnClient
from tests.fake_http import FakeHTTP
from tests.resources.conftest import make_job


class FakeResourceManager:
    """Keeps applications in memory and answers the Cluster Applications API like Hadoop 3."""

    def __init__(self):
        self.apps: dict[str, dict] = {}
        self.ids = itertools.count(1)

    def __call__(self, r):
        if r.path == "/ws/v1/cluster/apps/new-application" and r.method == "POST":
            return 200, {"application-id": f"application_1_{next(self.ids):04d}", "maximum-resource-capability": {}}
        if r.path == "/ws/v1/cluster/apps" and r.method == "POST":
            ctx = r.body
            self.apps[ctx["application-id"]] = {"id": ctx["application-id"], "name": ctx["application-name"],
                                                "state": "RUNNING", "finalStatus": "UNDEFINED",
                                                "applicationTags": ",".join(ctx["application-tags"]["tag"]),
                                                "ctx": ctx}  # fmt: skip
            return 202, None
        if r.path == "/ws/v1/cluster/apps" and r.method == "GET":
            tags = set(r.query["applicationTags"][0].split(","))
            apps = [a for a in self.apps.values() if tags <= set(a["applicationTags"].split(","))]
            return 200, {"apps": {"app": apps} if apps else None}
        if r.path.endswith("/state") and r.method == "PUT":
            app = self.apps[r.path.split("/")[-2]]
            app["state"], app["finalStatus"] = r.body["state"], "KILLED"
            return 200, {"state": "KILLED"}
        if r.path == "/ws/v1/cluster/metrics":
            return 200, {"clusterMetrics": {"availableMB": 65536, "totalMB": 262144, "availableVirtualCores": 40,
                                            "totalVirtualCores": 100}}  # fmt: skip
        return 404, {"RemoteException": {"message": f"no route {r.method} {r.path}"}}


@pytest.fixture
def yarn(job_env):
    rm = FakeResourceManager()
    http = FakeHTTP(rm)
    job = make_job({
        "data_executor": {"replicas": 1},
        "stream_executor": {"replicas": 2, "min_replicas": 1, "max_replicas": 5, "cpu": 1.5, "memory": "3Gi",
                            "command": ["primus", "stream", "{SPEC}"], "max_restarts": 2},
        "trainer": {"replicas": 1, "command": ["python", "-m", "primus_lib.cli.main", "train", "{SPEC}"],
                    "start_after": ["stream_executor"]},
    }, backend="yarn", clusters=[{"name": "rm1", "backend": "yarn", "resource_manager": "http://rm.example:8088",
                                  "queue": "ads"}])  # fmt: skip
    client = YarnClient("http://rm.example:8088", session=http.session(), user="primus")
    return YarnBackend(job, "/jobs/ctr.yaml", client=client), rm, http


def test_submit_builds_one_application_per_worker_in_start_order(yarn):
    backend, rm, http = yarn
    status = backend.submit()
    assert status.phase == "Running"
    names = [a["name"] for a in rm.apps.values()]
    assert names == ["ctr-demo-stream_executor-0", "ctr-demo-stream_executor-1", "ctr-demo-trainer-0"]
    ctx = rm.apps["application_1_0001"]["ctx"]
    assert ctx["resource"] == {"memory": 3072, "vCores": 2}
    assert ctx["queue"] == "ads" and ctx["application-type"] == "PRIMUS"
    assert ctx["max-app-attempts"] == 3  # failover: YARN retries the AM max_restarts times
    assert ctx["am-container-spec"]["commands"]["command"].startswith("primus stream /jobs/ctr.yaml")
    assert {"key": "PRIMUS_ROLE", "value": "stream_executor"} in ctx["am-container-spec"]["environment"]["entry"]
    assert ctx["application-tags"]["tag"] == ["primus-job:ctr-demo", "primus-role:stream_executor"]
    assert all(r.query.get("user.name") == ["primus"] for r in http.requests)
    # idempotent: a second submit starts nothing new
    backend.submit()
    assert len(rm.apps) == 3


def test_scale_resize_stop(yarn):
    backend, rm, http = yarn
    backend.submit()
    backend.scale("stream_executor", 4)
    assert backend.role_status("stream_executor").running == 4
    backend.scale("stream_executor", 1)
    assert backend.role_status("stream_executor").running == 1
    killed = [r for r in http.requests if r.method == "PUT"]
    assert killed and all(r.body == {"state": "KILLED"} for r in killed)
    backend.resize("stream_executor", memory=6 * 2**30)
    live = [a for a in rm.apps.values() if a["state"] == "RUNNING" and "stream_executor" in a["name"]]
    assert len(live) == 1 and live[0]["ctx"]["resource"]["memory"] == 6144
    assert backend.idleness()[0] == pytest.approx(0.25)
    backend.stop()
    assert all(a["state"] == "KILLED" for a in rm.apps.values())
    assert backend.status().phase == "Stopped"


def test_rm_errors_are_reported_with_the_call(job_env):
    http = FakeHTTP(lambda r: (403, {"RemoteException": {"message": "denied"}}))
    job = make_job({"data_executor": {"replicas": 1}, "trainer": {"command": ["x"]}}, backend="yarn",
                   clusters=[{"name": "rm", "backend": "yarn", "resource_manager": "http://rm:8088"}])  # fmt: skip
    backend = YarnBackend(job, client=YarnClient("http://rm:8088", session=http.session()))
    with pytest.raises(ResourceError, match="403"):
        backend.submit()
    with pytest.raises(ResourceError, match="resource_manager"):
        backend_for(make_job({"data_executor": {"replicas": 1}, "trainer": {"command": ["x"]}}, backend="yarn"))
