"""Airflow's connections as the source of ``primus_lib.credentials``: what a task installs with
``using(airflow_resolver())`` around its work, so that the engine's factories get typed
credentials of the connections a spec names, and nothing goes through ``os.environ``."""

from __future__ import annotations

import asyncio
from typing import Any

from primus_lib.credentials import Connection, Resolver


class AirflowConnections:
    """``BaseHook.get_connection`` (metadata DB, secrets backend or ``AIRFLOW_CONN_*``, as Airflow
    finds it), read once per id; a ``webhdfs`` connection listing several NameNodes is narrowed
    to the one that answers. ``aconnection`` is the triggerer's non-blocking read."""

    def __init__(self) -> None:
        self._found: dict[str, Connection | None] = {}

    def connection(self, conn_id: str) -> Connection | None:
        if conn_id not in self._found:
            from airflow.sdk import BaseHook

            self._found[conn_id] = _converted(conn_id, _get(lambda: BaseHook.get_connection(conn_id)))
        return self._found[conn_id]

    async def aconnection(self, conn_id: str) -> Connection | None:
        if conn_id not in self._found:
            from airflow.sdk import BaseHook

            try:
                raw = await BaseHook.aget_connection(conn_id)
            except Exception as exc:
                if not _missing(exc):
                    raise
                raw = None
            self._found[conn_id] = await asyncio.to_thread(_converted, conn_id, raw)
        return self._found[conn_id]


def airflow_resolver() -> Resolver:
    return Resolver(AirflowConnections())


def _get(read) -> Any:
    try:
        return read()
    except Exception as exc:
        if _missing(exc):
            return None
        raise


def _missing(exc: Exception) -> bool:
    from airflow.sdk.exceptions import AirflowNotFoundException

    return isinstance(exc, AirflowNotFoundException)


def _converted(conn_id: str, raw: Any) -> Connection | None:
    if raw is None:
        return None
    from primus_operators.hooks.storage import WEBHDFS_TYPES, active_namenode

    host = raw.host
    if (raw.conn_type or "") in WEBHDFS_TYPES and host and "," in host:
        host = active_namenode(conn_id, raw.port)
    return Connection(
        conn_id, raw.conn_type or "", host, raw.port, raw.login, raw.password, raw.schema, dict(raw.extra_dejson or {})
    )
