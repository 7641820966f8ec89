"""Airflow pool slots through Airflow's REST API (/api/v2/pools), the horizontal knob for batch
data executors (mapped tasks in the job's pool). Airflow 3 tasks cannot touch the metadata DB and
the Task SDK has no pool call, so the scaler speaks HTTP like any API client. primus_lib does
not import Airflow: this is plain ``requests``.
"""

from __future__ import annotations

from urllib.parse import quote

import requests

from primus_lib.scaling.base import Decision


class PoolAPIError(RuntimeError):
    pass


class AirflowPoolClient:
    """``base_url`` like http://127.0.0.1:8080; credentials for POST /auth/token, or a ready token."""

    def __init__(self, base_url: str, username: str | None = None, password: str | None = None,
                 token: str | None = None, session: requests.Session | None = None, timeout: float = 30.0) -> None:  # fmt: skip
        self.base_url, self.timeout = base_url.rstrip("/"), timeout
        self.username, self.password, self._token = username, password, token
        self.session = session or requests.Session()

    def token(self) -> str:
        if self._token is None:
            if not self.username:
                raise PoolAPIError(f"Airflow API {self.base_url}: no token and no username to get one")
            reply = self.session.post(f"{self.base_url}/auth/token", timeout=self.timeout,
                                      json={"username": self.username, "password": self.password or ""})  # fmt: skip
            if reply.status_code not in (200, 201):
                raise PoolAPIError(
                    f"Airflow API {self.base_url}: POST /auth/token answered {reply.status_code}: {reply.text[:200]}"
                )
            self._token = reply.json()["access_token"]
        return self._token

    def _call(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token()}"}
        return self.session.request(
            method, f"{self.base_url}/api/v2{path}", headers=headers, timeout=self.timeout, **kwargs
        )

    def get(self, name: str) -> dict | None:
        reply = self._call("GET", f"/pools/{quote(name, safe='')}")
        if reply.status_code == 404:
            return None
        if reply.status_code != 200:
            raise PoolAPIError(f"GET pool {name!r} answered {reply.status_code}: {reply.text[:200]}")
        return reply.json()

    def set_slots(self, name: str, slots: int, description: str = "") -> dict:
        """Set the pool's slots, creating the pool if it does not exist."""
        current = self.get(name)
        if current is None:
            reply = self._call("POST", "/pools", json={"name": name, "slots": slots, "description": description})
        else:  # Airflow 3.3 validates the whole body even with update_mask: send the pool back, new slots
            body = {"pool": name, "slots": slots, "include_deferred": current.get("include_deferred", False)}
            reply = self._call("PATCH", f"/pools/{quote(name, safe='')}", params={"update_mask": "slots"}, json=body)
        if reply.status_code not in (200, 201):
            raise PoolAPIError(
                f"setting pool {name!r} to {slots} slots answered {reply.status_code}: {reply.text[:200]}"
            )
        return reply.json()


class PoolActuator:
    """Horizontal decisions for batch data executors = the job's pool slots (one slot per executor)."""

    def __init__(self, client: AirflowPoolClient, pool: str) -> None:
        self.client, self.pool = client, pool

    def apply(self, decision: Decision) -> None:
        if decision.replicas is not None:
            self.client.set_slots(
                self.pool, decision.replicas, description=f"primus data executors ({decision.reason})"
            )
