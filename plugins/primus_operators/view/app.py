"""The FastAPI app of the Primus view, mounted at ``/primus`` by the plugin.

Plugin apps are not protected by Airflow: every route that shows a job depends on Airflow's own
authorization (``requires_access_dag``: the JWT of the ``Authorization: Bearer`` header or the
UI's ``_token`` cookie, checked by the configured auth manager), so an anonymous request gets
401 and a user without access to the DAG 403. Per-DAG access is the auth manager's: the FAB auth
manager's roles (``can_read`` on ``DAG:<dag_id>`` and ``DAG Runs``) restrict a user to some jobs;
the simple auth manager's roles see every job. Only the static JS/CSS (no data) are public.

    GET /primus/api/jobs            the Primus DAGs the caller may open (the DAG and its runs readable)
    GET /primus/api/jobs/{dag_id}   primus_lib.jobview.job_view of that job, with its runs
    GET /primus/ui/                 the page listing the jobs (the "Primus jobs" nav entry)
    GET /primus/ui/{dag_id}         the job's page (the "Primus" tab of a DAG)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag, requires_authenticated
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from primus_operators.view import airflow_state

HERE = Path(__file__).resolve().parent
PAGE = (HERE / "page.html").read_text(encoding="utf-8")

app = FastAPI(title="Primus view", description="Primus jobs: windows, metrics, scaling, DTGG")
app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")


@app.middleware("http")
async def _no_control_characters(request, call_next):
    """A dag_id with a NUL or another control character is refused with a clear 400 before any
    lookup (the metadata database would fail on it with a 500)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in request.scope["path"]):
        return JSONResponse({"detail": "path: control characters are not allowed in a dag_id"}, status_code=400)
    return await call_next(request)


ReadDag = Depends(requires_access_dag("GET"))
ReadRuns = Depends(requires_access_dag("GET", DagAccessEntity.RUN))


@app.get("/api/jobs", dependencies=[ReadDag])
def list_jobs(user: GetUserDep) -> list[str]:
    """The Primus DAGs the caller may open: read access to the DAG and to its runs (what the job's
    route asks), as the auth manager grants it (per DAG with the FAB auth manager's roles)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
    from airflow.models.dag import DagModel

    auth = get_auth_manager()
    readable = auth.get_authorized_dag_ids(user=user, method="GET")
    ids = [dag_id for dag_id in airflow_state.primus_dag_ids() if dag_id in readable]
    teams = DagModel.get_dag_id_to_team_name_mapping(ids) if ids else {}

    def runs_readable(dag_id: str) -> bool:
        details = DagDetails(id=dag_id, team_name=teams.get(dag_id))
        return auth.is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, details=details, user=user)

    return [dag_id for dag_id in ids if runs_readable(dag_id)]


@app.get("/api/jobs/{dag_id}", dependencies=[ReadRuns])
def job(dag_id: str) -> dict[str, Any]:
    from primus_lib.credentials import using
    from primus_lib.jobview import job_view
    from primus_lib.naming import TAG, TRAIN_TASK, pool_name
    from primus_operators._common import load_spec
    from primus_operators.hooks.connections import airflow_resolver

    found = airflow_state.primus_dag(dag_id)
    if found is None:
        raise HTTPException(
            404, f"{dag_id}: no Primus job of that name (a DAG tagged {TAG!r} with a {TRAIN_TASK!r} task)"
        )
    try:
        spec = load_spec(found.spec_path)
        runs = airflow_state.window_runs(dag_id)
        with using(airflow_resolver()):  # remote state (s3://): read with the job's connections, as its tasks do
            return job_view(spec, runs, found.doc_md, airflow_state.pool_slots(pool_name(spec.name)))
    except (OSError, ValueError) as exc:  # a spec or state file that cannot be read: say which
        raise HTTPException(422, f"{dag_id}: {exc}") from exc


@app.get("/ui/", response_class=HTMLResponse, dependencies=[Depends(requires_authenticated())])
def jobs_page() -> HTMLResponse:
    return HTMLResponse(_page(""))


@app.get("/ui/{dag_id}", response_class=HTMLResponse, dependencies=[ReadRuns])
def job_page(dag_id: str) -> HTMLResponse:
    return HTMLResponse(_page(dag_id))


def _page(dag_id: str) -> str:
    """The page shell: the job is named in an attribute (escaped), its data comes from the API."""
    import html

    return PAGE.replace("{{DAG_ID}}", html.escape(dag_id, quote=True))
