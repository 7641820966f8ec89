"""The Primus view of the Airflow UI: a FastAPI app mounted by the plugin at ``/primus`` (JSON
endpoints and the page, behind Airflow's own authentication) and the external views that put
it in the UI (a "Primus" tab on each DAG, a "Primus jobs" entry in the navigation)."""

from __future__ import annotations

URL_PREFIX = "/primus"
