"""The Airflow plugin: registers the Timer timetable, the pool listener and the Primus view.

Loaded through the ``airflow.plugins`` entry point (``primus_operators.plugin:PrimusPlugin``)
or from ``plugins/`` as ``[core] plugins_folder``.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from primus_operators import listeners
from primus_operators.timetables.window import PrimusWindowTimetable
from primus_operators.view import URL_PREFIX


class _ViewApp:
    """The view's FastAPI app, imported when the API server asks for it: the scheduler, the DAG
    processor and every task process load this plugin too and need neither FastAPI nor the app."""

    def __get__(self, instance: object, owner: type) -> list[dict[str, Any]]:
        from primus_operators.view.app import app

        return [{"app": app, "url_prefix": URL_PREFIX, "name": "Primus view"}]


class PrimusPlugin(AirflowPlugin):
    name = "primus"
    timetables = [PrimusWindowTimetable]
    listeners = [listeners]
    fastapi_apps = _ViewApp()
    # hrefs are relative to the UI's base URL; with url_route the UI shows them in a frame
    external_views = [
        {"name": "Primus", "href": "primus/ui/{DAG_ID}", "destination": "dag", "url_route": "primus"},
        {"name": "Primus jobs", "href": "primus/ui/", "destination": "nav", "url_route": "primus-jobs"},
    ]
