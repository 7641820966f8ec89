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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import requests


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

    def create_backfill(self, body: dict) -> dict:
        """``POST /api/v2/backfills`` (keys left None are not sent)."""
        return self.request("POST", "/api/v2/backfills", {k: v for k, v in body.items() if v is not None})

    def dag_runs(self, dag_id: str) -> list[dict]:
        """Every run, oldest first, page by page: the API silently caps a page at ``[api]
        maximum_page_limit`` (100 by default), so one call never saw the runs of a longer backfill."""
        runs: list[dict] = []
        while True:
            params = {"limit": 100, "offset": len(runs), "order_by": "logical_date"}
            page = self.request("GET", f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns", params=params)
            runs += page["dag_runs"]
            if not page["dag_runs"] or len(runs) >= page.get("total_entries", 0):
                return runs

    def wait_backfill(
        self,
        backfill_id: int,
        dag_id: str,
        expected: int,
        timeout: float,
        poll: float = 3.0,
        on_poll: Callable[[list[dict]], None] | None = None,
    ) -> list[dict]:
        """Wait until the backfill completed and its runs finished; return its runs (oldest first).
        ``on_poll(runs)`` sees the backfill runs after every poll (``primus backfill --wait``'s lines)."""
        deadline = time.monotonic() + timeout
        while True:
            runs = [r for r in self.dag_runs(dag_id) if r.get("run_type") == "backfill"]
            if on_poll is not None:
                on_poll(runs)
            done = [r for r in runs if r["state"] in ("success", "failed")]
            info = self.request("GET", f"/api/v2/backfills/{backfill_id}")
            if info.get("completed_at") and len(done) >= expected:
                return sorted(runs, key=lambda r: r["logical_date"])
            if time.monotonic() > deadline:
                states = {r["logical_date"]: r["state"] for r in runs}
                raise AirflowApiError(f"backfill {backfill_id} of {dag_id} not finished after {timeout:.0f}s: {states}")
            time.sleep(poll)

    # -- task instances -----------------------------------------------------------------------
    def set_task_note(self, dag_id: str, run_id: str, task_id: str, note: str) -> None:
        """The note shown on a task instance in the Grid view."""
        dag, run, task = (quote(part, safe="") for part in (dag_id, run_id, task_id))
        path = f"/api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}"
        self.request("PATCH", path, {"note": note}, {"update_mask": "note"})
