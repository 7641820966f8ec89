"""primus_lib.airflow_api: request construction on a FAKE transport (tests/fake_http.py). Against a
real API server: tests/scaling/test_scaler_sensor.py (pools) and tests/airflow/test_backfill.py."""

from __future__ import annotations

import pytest

from primus_lib.airflow_api import AirflowApi, AirflowApiError
from tests.fake_http import FakeHTTP


def _server(pools: dict[str, dict]):
    def answer(r):
        if r.path == "/auth/token":
            ok = r.body == {"username": "u", "password": "p"}
            return (201, {"access_token": "t"}) if ok else (401, {"detail": "bad credentials"})
        if r.path.startswith("/api/v2/pools/") and r.method == "GET":
            name = r.path.rsplit("/", 1)[1]
            return (200, pools[name]) if name in pools else (404, {"detail": "not found"})
        return 200, {"id": 3, **(r.body or {})}

    return FakeHTTP(answer)


def test_token_once_then_bearer_on_every_call():
    http = _server({})
    api = AirflowApi("http://af:8080/", "u", "p", session=http.session())
    api.set_paused("ctr-demo", False)
    api.set_paused("ctr-demo", True)
    assert [r.path for r in http.requests] == ["/auth/token", "/api/v2/dags/ctr-demo", "/api/v2/dags/ctr-demo"]
    assert all(r.headers["Authorization"] == "Bearer t" for r in http.requests[1:])
    assert http.requests[-1].body == {"is_paused": True}


def test_without_a_password_no_token_is_asked_for():
    http = _server({})
    AirflowApi("http://af:8080", "admin", None, session=http.session()).set_paused("d", False)
    assert [r.path for r in http.requests] == ["/api/v2/dags/d"] and "Authorization" not in http.requests[0].headers


def test_a_missing_pool_is_created_an_existing_one_patched():
    http = _server({"primus-a": {"name": "primus-a", "slots": 2, "include_deferred": True}})
    api = AirflowApi("http://af:8080", "u", "p", session=http.session())
    api.set_pool_slots("primus-b", 4, "why")
    assert (http.requests[-1].method, http.requests[-1].path) == ("POST", "/api/v2/pools")
    assert http.requests[-1].body == {"name": "primus-b", "slots": 4, "description": "why"}
    api.set_pool_slots("primus-a", 5)
    patch = http.requests[-1]
    assert (patch.method, patch.path, patch.query) == ("PATCH", "/api/v2/pools/primus-a", {"update_mask": ["slots"]})
    assert patch.body == {"pool": "primus-a", "slots": 5, "include_deferred": True}
    count = len(http.requests)
    api.ensure_pool("primus-a", 9)  # exists: kept as it is
    assert len(http.requests) == count + 1 and http.requests[-1].method == "GET"


def test_backfill_body_and_task_note_path():
    http = _server({})
    api = AirflowApi("http://af:8080", "u", "p", session=http.session())
    assert api.create_backfill({"dag_id": "d", "dag_run_conf": None, "max_active_runs": 3})["id"] == 3
    assert http.requests[-1].body == {"dag_id": "d", "max_active_runs": 3}  # None is not sent
    api.set_task_note("d", "manual__2026-11-01T00:00:00+00:00", "train", "auc=0.7")
    note = http.requests[-1]
    assert note.path == "/api/v2/dags/d/dagRuns/manual__2026-11-01T00%3A00%3A00%2B00%3A00/taskInstances/train"
    assert note.body == {"note": "auc=0.7"} and note.query == {"update_mask": ["note"]}


def test_errors_carry_the_status_and_name_the_call():
    http = _server({})
    with pytest.raises(AirflowApiError, match=r"POST /auth/token: HTTP 401") as caught:
        AirflowApi("http://af:8080", "u", "wrong", session=http.session()).pool("x")
    assert caught.value.status == 401
    assert AirflowApi("http://af:8080", "u", "p", session=http.session()).pool("absent") is None


def _busy_dag(run_state: str, completes_after: int = 2):
    """A FAKE API whose DAG's latest backfill (7) Airflow marks complete after ``completes_after`` reads:
    a new backfill is refused (409) until then; the runs of 7's range are ``run_state``."""
    reads = []

    def answer(r):
        if r.path == "/api/v2/backfills" and r.method == "POST":
            if len(reads) < completes_after:
                return 409, {"detail": "There is already a running backfill for dag d"}
            return 200, {"id": 8, **r.body}
        if r.path == "/api/v2/backfills":
            return 200, {"backfills": [{"id": 7, "dag_id": "d", "completed_at": None, **RANGE}]}
        if r.path == "/api/v2/dags/d/dagRuns":
            return 200, {"dag_runs": [{"logical_date": RANGE["from_date"], "state": run_state}], "total_entries": 1}
        if r.path == "/api/v2/backfills/7":
            reads.append(r)
            return 200, {"id": 7, "dag_id": "d", "completed_at": "2026-12-08T02:00:30Z" if len(reads) >= 2 else None}
        raise AssertionError(r.path)

    return FakeHTTP(answer)


RANGE = {"from_date": "2026-11-01T00:00:00Z", "to_date": "2026-11-01T01:00:00Z"}


def test_a_backfill_refused_while_the_finished_one_awaits_airflows_mark_is_created_once_marked():
    http = _busy_dag("success")
    settled = []
    api = AirflowApi("http://af:8080", session=http.session())
    created = api.create_backfill({"dag_id": "d", **RANGE}, on_settle=settled.append)
    assert created["id"] == 8 and [b["id"] for b in settled] == [7]
    posts = [r for r in http.requests if r.method == "POST"]
    assert len(posts) == 2  # refused once, asked again once Airflow marked backfill 7 complete
    listing = next(r for r in http.requests if r.path == "/api/v2/backfills" and r.method == "GET")
    assert listing.query == {"dag_id": ["d"], "order_by": ["-id"], "limit": ["1"]}


def test_a_backfill_refused_while_the_other_has_a_run_in_flight_fails_at_once():
    http = _busy_dag("running")
    api = AirflowApi("http://af:8080", session=http.session())
    with pytest.raises(AirflowApiError, match="HTTP 409") as caught:
        api.create_backfill({"dag_id": "d", **RANGE}, on_settle=lambda _: pytest.fail("nothing to wait for"))
    assert caught.value.status == 409
    assert not any(r.path == "/api/v2/backfills/7" for r in http.requests)
