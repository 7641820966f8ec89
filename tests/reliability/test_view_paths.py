"""User paths cannot escape their roots, at run time: the Primus view's endpoints (real API server of
``airflow_server``) take a dag_id, never a path, so traversal in it (plain, URL-encoded, double-
encoded, backslashes) reaches no file and discloses none; and the names the view reads from a
job's state (progress.json's window keys, the ledger's windows) are shown as text and open no file.
``primus`` CLI ``--out`` paths are the user's own choice (written where the user asks).
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOSTILE = [
    "..",
    "%2e%2e",
    "%2E%2E",
    "../../etc/passwd",
    "..%2F..%2Fetc%2Fpasswd",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "..%5C..%5Cetc%5Cpasswd",
    "..\\..\\etc\\passwd",
    "%252e%252e%252fetc%252fpasswd",
    "....//....//etc/passwd",
    "af-backfill/../../../../etc/passwd",
    "af-backfill%2F..%2F..%2F..%2Fetc%2Fpasswd",
    "%2Fetc%2Fpasswd",
    "af-backfill%00.yaml",
    "x'%20OR%20'1'%3D'1",
]


def _get(url: str, raw_path: str, token: str) -> tuple[int, str]:
    """The request exactly as written: no client-side normalisation of dot segments or encodings."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("GET", raw_path, headers={"Authorization": f"Bearer {token}", "Cookie": f"_token={token}"})
        reply = conn.getresponse()
        return reply.status, reply.read().decode("utf-8", errors="replace")
    finally:
        conn.close()


def _disclosures(body: str, server) -> list[str]:
    passwd = Path("/etc/passwd").read_text().splitlines()[0]
    found = []
    if passwd in body:
        found.append("/etc/passwd")
    for secret_path in (str(server.home), str(server.job.root)):
        if secret_path in body:
            found.append(f"the path {secret_path}")
    return found


def test_traversal_in_the_dag_id_reaches_no_file(airflow_server):
    reply = requests.post(
        f"{airflow_server.url}/auth/token", timeout=30, json={"username": "admin", "password": airflow_server.password}
    )
    token = reply.json()["access_token"]
    answers, problems = {}, []
    for hostile in HOSTILE:
        for prefix in ("/primus/api/jobs/", "/primus/ui/"):
            status, body = _get(airflow_server.url, prefix + hostile, token)
            answers[prefix + hostile] = status
            problems += [f"{prefix}{hostile}: {what}" for what in _disclosures(body, airflow_server)]
            if status >= 500:
                problems.append(f"{prefix}{hostile}: {status} {body[:120]}")  # bad input is a clear 4xx
            if prefix.startswith("/primus/api/") and status == 200:
                problems.append(f"{prefix}{hostile}: 200 {body[:120]}")  # a job's view, or any data
            if prefix == "/primus/ui/" and status == 200 and "data-dag-id=" in body:
                shown = body.split('data-dag-id="', 1)[1].split('"', 1)[0]
                if any(c in shown for c in "<>\"'"):  # the page shell: no data, the name as text only
                    problems.append(f"{prefix}{hostile}: the attribute is not escaped: {shown}")
    assert not problems, "\n".join(problems)
    # The view answers a single-segment name it does not know with its own 404 (no file looked at).
    status, body = _get(airflow_server.url, "/primus/api/jobs/%2e%2e", token)
    assert status == 404 and "no Primus job" in json.loads(body)["detail"]
    status, body = _get(airflow_server.url, "/primus/api/jobs/af-backfill%00.yaml", token)
    assert status == 400 and "control characters" in json.loads(body)["detail"]
    print("answers:", json.dumps(answers, indent=0))


def test_window_names_from_the_state_open_no_file(tmp_path, monkeypatch):
    """progress.json keys that look like paths are shown as text, and the view reads nothing outside the job."""
    from primus_lib.jobview import job_view
    from primus_lib.paths import JobPaths
    from primus_lib.progress import write_progress
    from primus_lib.spec import load_job
    from tests.fixtures.airflow import make_job

    job = make_job(tmp_path / "job", name="hostile-state", end="2026-11-01T01:00:00Z", rows_per_hour=20)
    for key, value in job.env.items():
        monkeypatch.setenv(key, value)
    spec = load_job(job.spec)
    paths = JobPaths.for_job(spec)
    entry = {"samples": 1, "auc": 0.5, "logloss": 0.7, "at": 0.0}
    hostile = ["history/../../../../etc/passwd", "../../etc/passwd/20261101T000000Z", "history/20261101T000000Z"]
    write_progress(paths.progress, {key: entry for key in hostile}, 1, {}, "offline")
    opened: list[str] = []
    real_open = Path.open

    def watched(self, *args, **kwargs):
        opened.append(str(Path(self).resolve()))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", watched)
    view = job_view(spec, [], None, 2)
    assert any(p.endswith("/trainer/progress.json") for p in opened)  # the watch sees the view's reads
    outside = [p for p in opened if not p.startswith(str(tmp_path.resolve()))]
    assert not outside, outside
    text = json.dumps(view)
    assert Path("/etc/passwd").read_text().splitlines()[0] not in text
    assert {f"{m['stream']}/{m['window']}" for m in view["metrics"]} <= set(hostile)
