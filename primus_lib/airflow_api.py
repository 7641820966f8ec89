"""The Airflow REST API (``/api/v2``) as primus uses it: pools, backfills, task notes.

One client for every caller: ``primus backfill``, the scaler's pool slots
(``primus_lib.scaling.airflow_pools``) and the trainer task's note. Airflow 3 tasks cannot touch
the metadata DB and the Task SDK has no call for pools or notes, so they speak HTTP like any API
client. Plain ``requests``: ``primus_lib`` never imports Airflow.

Authentication: with a password the client gets a JWT from ``POST /auth/token`` on its first
call; with neither password nor token it sends none (an API server that requires none). A
command line never carries the password (``ps`` shows argv to every user of the host): callers
read it from a file or a connection (``primus_lib.credentials``).
``requests`` is imported on first use: every ``primus`` command imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from primus_lib.timegrid import as_utc, iso, parse_utc

if TYPE_CHECKING:
    import requests


FINAL_STATES = ("success", "failed")  # a DAG run's states that end it


class AirflowApiError(RuntimeError):
    """A call answered with an HTTP error; ``status`` is its code (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class AirflowApi:
    """``base_url`` like http://127.0.0.1:8080 (no ``/api/v2``)."""

    def __init__(
        self,
        base_url: str,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        session: requests.Session | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.base_url, self.timeout = base_url.rstrip("/"), timeout
        import requests

        self.username, self.password, self._token = username, password, token
        self.session = session or requests.Session()

    # -- transport ---------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        if self._token is None and self.password is not None:
            reply = self._send("POST", "/auth/token", {"username": self.username or "", "password": self.password})
            self._token = reply["access_token"]
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _send(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        params: dict | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        import requests

        try:
            reply = self.session.request(
                method, self.base_url + path, json=body, params=params, headers=headers, timeout=self.timeout
            )
        except requests.RequestException as exc:
            raise AirflowApiError(f"Airflow API {self.base_url}: {method} {path}: {exc}") from exc
        if reply.status_code >= 400:
            raise AirflowApiError(
                f"Airflow API {self.base_url}: {method} {path}: HTTP {reply.status_code}: {reply.text[:500]}",
                reply.status_code,
            )
        return reply.json() if reply.content else None

    def request(self, method: str, path: str, body: dict | None = None, params: dict | None = None) -> Any:
        """One authenticated JSON call; ``path`` starts with ``/api/v2``."""
        return self._send(method, path, body, params, self._headers())

    # -- pools: the batch data executors' horizontal knob -------------------------------------
    def pool(self, name: str) -> dict | None:
        try:
            return self.request("GET", f"/api/v2/pools/{quote(name, safe='')}")
        except AirflowApiError as exc:
            if exc.status == 404:
                return None
            raise

    def set_pool_slots(self, name: str, slots: int, description: str = "") -> dict:
        """Set the pool's slots, creating the pool if it does not exist."""
        current = self.pool(name)
        if current is None:
            return self.request("POST", "/api/v2/pools", {"name": name, "slots": slots, "description": description})
        # Airflow 3.3 validates the whole body even with update_mask: send the pool back, new slots
        body = {"pool": name, "slots": slots, "include_deferred": current.get("include_deferred", False)}
        return self.request("PATCH", f"/api/v2/pools/{quote(name, safe='')}", body, {"update_mask": "slots"})

    def ensure_pool(self, name: str, slots: int, description: str = "Primus data executors") -> None:
        """Create the pool if missing (tasks in a missing pool never run); an existing one is kept."""
        if self.pool(name) is None:
            self.request("POST", "/api/v2/pools", {"name": name, "slots": slots, "description": description})

    # -- DAGs, runs, backfills ----------------------------------------------------------------
    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.request("PATCH", f"/api/v2/dags/{quote(dag_id, safe='')}", {"is_paused": paused})

    def create_backfill(
        self, body: dict, *, settle: float = 45.0, on_settle: Callable[[dict], None] | None = None
    ) -> dict:
        """``POST /api/v2/backfills`` (keys left None are not sent).

        Airflow runs one backfill of a DAG at a time, and marks one complete only up to 30 s after its last
        run ended (``wait_backfill``). Refused (409) while the DAG's latest backfill has every run of its
        range finished, this waits up to ``settle`` seconds for Airflow to mark that one complete
        (``on_settle(that backfill)`` first), then asks again; one with a run in flight refuses at once."""
        payload = {k: v for k, v in body.items() if v is not None}
        try:
            return self.request("POST", "/api/v2/backfills", payload)
        except AirflowApiError as exc:
            finished = self._finished_backfill(body["dag_id"]) if exc.status == 409 else None
            if finished is None:
                raise
        if on_settle is not None:
            on_settle(finished)
        self.await_backfill_complete(finished["id"], settle)
        return self.request("POST", "/api/v2/backfills", payload)

    def latest_backfill(self, dag_id: str) -> dict | None:
        """The DAG's newest backfill (None: it has had none): the only one Airflow may not have marked complete,
        since it runs one backfill of a DAG at a time."""
        params = {"dag_id": dag_id, "order_by": "-id", "limit": 1}
        latest = self.request("GET", "/api/v2/backfills", params=params)["backfills"]
        return latest[0] if latest else None

    def _finished_backfill(self, dag_id: str) -> dict | None:
        """The DAG's latest backfill when Airflow has yet to mark it complete but every run of its range ended."""
        latest = self.latest_backfill(dag_id)
        if latest is None or latest.get("completed_at"):
            return None
        runs = self.dag_runs(dag_id, parse_utc(latest["from_date"]), parse_utc(latest["to_date"]))
        return latest if all(r["state"] in FINAL_STATES for r in runs) else None

    def await_backfill_complete(self, backfill_id: int, timeout: float, poll: float = 2.0) -> dict:
        """The backfill once Airflow has marked it complete (``completed_at``), within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not (info := self.request("GET", f"/api/v2/backfills/{backfill_id}")).get("completed_at"):
            if time.monotonic() > deadline:
                raise AirflowApiError(
                    f"backfill {backfill_id} of {info.get('dag_id')}: not marked complete by Airflow after {timeout:.0f}s"
                )
            time.sleep(poll)
        return info

    def dag_runs(self, dag_id: str, first: datetime | None = None, last: datetime | None = None) -> list[dict]:
        """Every run (with ``first`` / ``last``: those whose logical date lies between them, both
        included), oldest first, page by page: the API silently caps a page at ``[api]
        maximum_page_limit`` (100 by default), so one call never saw the runs of a longer backfill."""
        bounds = {f"logical_date_{op}": iso(when) for op, when in (("gte", first), ("lte", last)) if when is not None}
        runs: list[dict] = []
        while True:
            params = {"limit": 100, "offset": len(runs), "order_by": "logical_date", **bounds}
            page = self.request("GET", f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns", params=params)
            runs += page["dag_runs"]
            if not page["dag_runs"] or len(runs) >= page.get("total_entries", 0):
                return runs

    def wait_backfill(
        self,
        backfill_id: int,
        dag_id: str,
        windows: Sequence[datetime],
        timeout: float,
        poll: float = 3.0,
        on_poll: Callable[[list[dict]], None] | None = None,
    ) -> list[dict]:
        """Wait until every one of the backfill's ``windows`` (logical dates) has a run in a final state;
        return those runs, oldest first. ``on_poll(runs)`` sees them after every poll (``primus backfill
        --wait``'s lines).

        Not until Airflow marks the backfill complete: its scheduler looks for complete backfills every
        30 s (``_mark_backfills_complete``), which held a wait 15 s on average, up to 30 s, after the last
        window finished (the demo's 12 windows: 36-40 s of runs, 55 s waited). A backfill creates its runs,
        or clears a window's run back to queued, before its creation returns, and a DAG has one run per
        logical date: so each window's run is the backfill's, or one it skipped (done already, or in
        flight: that one is waited for too)."""
        wanted = {as_utc(w) for w in windows}
        if not wanted:
            raise ValueError("wait_backfill: no window to wait for")
        deadline = time.monotonic() + timeout
        while True:
            runs = [
                r
                for r in self.dag_runs(dag_id, min(wanted), max(wanted))
                if r.get("logical_date") and parse_utc(r["logical_date"], "logical_date") in wanted
            ]
            if on_poll is not None:
                on_poll(runs)
            if len(runs) == len(wanted) and all(r["state"] in FINAL_STATES for r in runs):
                return runs
            if time.monotonic() > deadline:
                states = {r["logical_date"]: r["state"] for r in runs}
                missing = sorted(wanted - {parse_utc(r["logical_date"]) for r in runs})
                raise AirflowApiError(
                    f"backfill {backfill_id} of {dag_id} not finished after {timeout:.0f}s: {states}"
                    + (f"; no run for {', '.join(map(iso, missing))}" if missing else "")
                )
            time.sleep(poll)

    # -- task instances -----------------------------------------------------------------------
    def set_task_note(self, dag_id: str, run_id: str, task_id: str, note: str) -> None:
        """The note shown on a task instance in the Grid view."""
        dag, run, task = (quote(part, safe="") for part in (dag_id, run_id, task_id))
        path = f"/api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}"
        self.request("PATCH", path, {"note": note}, {"update_mask": "note"})
