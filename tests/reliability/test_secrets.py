"""No secret in a spec, a log, an XCom or the Primus view: a job whose state lives on S3 (SeaweedFS)
and whose ledger is PostgreSQL runs a couple of windows through a real ``airflow standalone``, with
its credentials only where they belong (the S3 keys: an Airflow connection made through the REST
API, named by ``spec.storage.connection_id``; the ledger password: the workers' environment,
named by ``${PRIMUS_LEDGER_PASSWORD}`` in the spec), then every output of the run is searched for
each secret: the Airflow task and triggerer logs, the XComs, the rendered template fields, the
Primus view's JSON, the job's local and S3 state (progress, manifests, metric snapshots, resource
table, role logs), the ledger's rows and the command lines of every process. The windows run as
``primus backfill --api --wait`` (a subprocess, the Airflow password from ``--password-file``)
while every process's argv is sampled (psutil, every 0.2 s): none of the four secrets (S3 keys,
ledger password, Airflow password) is ever in one.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.fixtures._proc import free_port, start, stop
from tests.fixtures.airflow import airflow_binary, airflow_env, make_job, sync_dag_stubs
from tests.fixtures.s3 import start_seaweedfs
from tests.fixtures.specs import airflow_doc, job_yaml
from tests.reliability.argv import ArgvSampler

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.airflow, pytest.mark.s3, pytest.mark.postgres]

JOB, BUCKET, CONN_ID = "secret-job", "primus-state", "primus_secret_s3"
AUTH_PASSWORDS = "simple_auth_manager_passwords.json.generated"  # the simple auth manager's user store
WINDOWS = ["20261101T000000Z", "20261101T010000Z"]


@dataclass
class Secrets:
    s3_access: str
    s3_secret: str
    ledger_password: str
    airflow_password: str

    def items(self) -> dict[str, str]:
        return {
            "S3 access key": self.s3_access,
            "S3 secret key": self.s3_secret,
            "ledger password": self.ledger_password,
            "Airflow password": self.airflow_password,
        }


@dataclass
class Run:
    runs: list[dict]
    outputs: dict[str, bytes]  # where -> what it holds
    deferred: int  # train task instances that went through the trigger
    role_env: bytes  # the job supervisor's environment and mounted secret files: where credentials belong
    mounted: str  # that secret directory (PRIMUS_SECRETS_DIR of the roles)
    argv: ArgvSampler  # every process's command line during the backfill
    backfill: subprocess.CompletedProcess


def _ledger_database(postgres, password: str) -> str:
    """A login role of its own with the secret password, and its database; the spec's URL."""
    role = f"ledger_{secrets.token_hex(4)}"
    postgres.create_login(role, password)
    return f"postgresql+psycopg2://{role}:${{PRIMUS_LEDGER_PASSWORD}}@{postgres.host}:{postgres.port}/{role}"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _s3_objects(url: str, access: str, secret: str) -> dict[str, bytes]:
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        access_key=access, secret_key=secret, endpoint_override=url.split("//")[1], scheme="http", region="us-east-1"
    )
    infos = fs.get_file_info(pafs.FileSelector(BUCKET, recursive=True))
    out = {}
    for info in infos:
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as stream:
                out[f"s3://{info.path}"] = stream.read()
    return out


def _ledger_rows(url: str) -> dict[str, bytes]:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    out = {}
    try:
        with engine.connect() as conn:
            for table in sa.inspect(conn).get_table_names():
                rows = conn.execute(sa.text(f'SELECT * FROM "{table}"')).fetchall()
                out[f"ledger table {table}"] = repr(rows).encode()
    finally:
        engine.dispose()
    return out


def _airflow_outputs(api, runs: list[dict]) -> dict[str, bytes]:
    """XComs, task instances (rendered fields included) and the Primus view, as the REST API gives them."""
    out: dict[str, bytes] = {}
    for run in runs:
        base = f"/api/v2/dags/{JOB}/dagRuns/{quote(run['dag_run_id'], safe='')}/taskInstances"
        tis = api.request("GET", base, params={"limit": 1000})["task_instances"]
        out[f"task instances of {run['dag_run_id']}"] = json.dumps(tis).encode()
        for ti in tis:
            out[f"rendered fields {ti['task_id']}[{ti['map_index']}]"] = json.dumps(ti.get("rendered_fields")).encode()
            xcom_base = f"{base}/{quote(ti['task_id'], safe='')}/xcomEntries"
            entries = api.request("GET", xcom_base, params={"map_index": ti["map_index"], "limit": 1000})
            for entry in entries["xcom_entries"]:
                value = api.request(
                    "GET", f"{xcom_base}/{quote(entry['key'], safe='')}", params={"map_index": ti["map_index"]}
                )
                out[f"xcom {ti['task_id']}[{ti['map_index']}].{entry['key']}"] = json.dumps(value).encode()
    out["primus view"] = json.dumps(api.request("GET", f"/primus/api/jobs/{JOB}")).encode()
    out["primus view list"] = json.dumps(api.request("GET", "/primus/api/jobs")).encode()
    out["dag details"] = json.dumps(api.request("GET", f"/api/v2/dags/{JOB}/details")).encode()
    return out


@pytest.fixture(scope="module")
def job_secrets() -> Secrets:
    token = secrets.token_hex
    return Secrets(f"AK{token(8)}", f"SK{token(16)}", f"PW{token(12)}", f"AP{token(12)}")


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory, postgres_server, job_secrets: Secrets) -> Run:
    """Two windows of a job on S3 + PostgreSQL through the real Airflow; everything it produced."""
    from primus_lib.airflow_api import AirflowApi

    binary = airflow_binary()
    root = tmp_path_factory.mktemp("secrets")
    (root / "s3").mkdir()
    weed, s3_url = start_seaweedfs(root / "s3", job_secrets.s3_access, job_secrets.s3_secret)
    proc = None
    try:
        import pyarrow.fs as pafs

        pafs.S3FileSystem(
            access_key=job_secrets.s3_access,
            secret_key=job_secrets.s3_secret,
            scheme="http",
            endpoint_override=s3_url.split("//")[1],
            region="us-east-1",
            allow_bucket_creation=True,
        ).create_dir(BUCKET)
        job = make_job(root / "job", name=JOB, end="2026-11-01T02:00:00Z", rows_per_hour=200)
        database = _ledger_database(postgres_server, job_secrets.ledger_password)
        storage = {"root": f"s3://{BUCKET}/jobs", "connection_id": CONN_ID, "database": database}
        # the train task defers at once: the triggerer must read the S3 progress via the connection id
        airflow = {"poll_interval": "1s", "trainer_wait": "0s"}
        spec_text = job_yaml(airflow_doc(JOB, hours=2, storage=storage, airflow=airflow))
        job.spec.write_text(spec_text)
        assert not any(s in spec_text for s in job_secrets.items().values())  # the spec names, never holds
        home = root / "home"
        home.mkdir()
        port, password = free_port(), job_secrets.airflow_password
        (home / AUTH_PASSWORDS).write_text(json.dumps({"admin": password}))  # kept: it only makes missing users
        env = airflow_env(
            home,
            job,
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__PORT=str(port),
            AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
            AIRFLOW__API__WORKERS="1",
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgres_server.create_database("airflow_secrets"),
            AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",  # more output to search
            PRIMUS_LEDGER_PASSWORD=job_secrets.ledger_password,
        )
        for name in [k for k in env if k.startswith("AWS_") or k.startswith("PRIMUS_AIRFLOW_")]:
            del env[name]  # the S3 keys come from the connection only, the Airflow password from a file
        sync_dag_stubs(env, job.dags)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            import requests

            body = requests.get(f"{url}/api/v2/monitor/health", timeout=2).json()
            return all(body.get(part, {}).get("status") == "healthy" for part in ("scheduler", "triggerer"))

        proc = start([str(binary), "standalone"], root / "standalone.log", healthy, timeout=300, env=env)
        api = AirflowApi(url, "admin", password)
        extra = json.dumps({"endpoint_url": s3_url, "region_name": "us-east-1"})
        api.request(
            "POST",
            "/api/v2/connections",
            {
                "connection_id": CONN_ID,
                "conn_type": "aws",
                "login": job_secrets.s3_access,
                "password": job_secrets.s3_secret,
                "extra": extra,
            },
        )
        deadline = time.monotonic() + 180
        while True:
            try:
                api.request("GET", f"/api/v2/dags/{JOB}")  # parsed: `primus backfill` unpauses it
                break
            except Exception:
                assert time.monotonic() < deadline, f"{JOB} not parsed: {api.request('GET', '/api/v2/importErrors')}"
                time.sleep(2)
        password_file = root / "airflow-password"  # outside AIRFLOW_HOME: its files are searched below
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
        command = [
            str(Path(env["PATH"].split(os.pathsep)[0]) / "primus"),
            "backfill",
            str(job.spec),
            "--api",
            url,
            "--password-file",
            str(password_file),
            "--from",
            "2026-11-01T00:00Z",
            "--to",
            "2026-11-01T02:00Z",
            "--max-active-runs",
            "1",
            "--wait",
            "--timeout",
            "900",
            "--quiet",
        ]
        role_env, mounted = b"", ""
        with ArgvSampler(every=0.2) as argv:
            backfill = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                deadline = time.monotonic() + 1000
                while backfill.poll() is None:  # while the roles run: their env, where the credentials belong
                    assert time.monotonic() < deadline, "primus backfill --wait did not return"
                    role_env, mounted = _supervisor_environ(job.home) if not mounted else (role_env, mounted)
                    time.sleep(1)
            finally:
                if backfill.poll() is None:
                    backfill.kill()
            done = subprocess.CompletedProcess(command, backfill.returncode, *backfill.communicate())
        runs = sorted(
            (r for r in api.dag_runs(JOB) if r.get("run_type") == "backfill"), key=lambda r: r["logical_date"]
        )
        outputs = _airflow_outputs(api, runs)
        outputs["process command lines (ps)"] = "\n".join(" ".join(cmd) for cmd in sorted(argv.seen)).encode()
        outputs["primus backfill output"] = (done.stdout + done.stderr).encode()
        # the task, triggerer and DAG processor logs; airflow.cfg (not the auth manager's own password store)
        outputs.update({k: v for k, v in _files(home).items() if not k.endswith(AUTH_PASSWORDS)})
        outputs["airflow standalone log"] = (root / "standalone.log").read_bytes()
        outputs.update(_files(job.home))  # the job's private state: resource table, role logs, staging
        outputs.update(_s3_objects(s3_url, job_secrets.s3_access, job_secrets.s3_secret))
        outputs.update(_ledger_rows(database.replace("${PRIMUS_LEDGER_PASSWORD}", job_secrets.ledger_password)))
        outputs.update(_role_logs(job.home, env))
        deferred = sum(
            b"deferring until it consumed" in data for where, data in outputs.items() if "task_id=train" in where
        )
        return Run(runs, outputs, deferred, role_env, mounted, argv, done)
    finally:
        _stop_job(job, env) if proc is not None else None
        if proc is not None:
            stop(proc, timeout=30)
        stop(weed)


def _supervisor_environ(primus_home: Path) -> tuple[bytes, str]:
    """(/proc/PID/environ of the job's local supervisor while it runs (the roles inherit it) and the
    secret files it mounts for them; that directory), or (b"", "")."""
    for proc_dir in Path("/proc").iterdir():
        try:
            cmdline = (proc_dir / "cmdline").read_bytes()
            if b"primus_lib.resources.supervisor" in cmdline and str(primus_home).encode() in cmdline:
                environ = (proc_dir / "environ").read_bytes()
                mounted = dict(v.split(b"=", 1) for v in environ.split(b"\0") if b"=" in v).get(b"PRIMUS_SECRETS_DIR")
                if mounted is None:
                    return environ, ""
                files = b"".join(p.read_bytes() for p in sorted(Path(mounted.decode()).iterdir()))
                return environ + files, mounted.decode()
        except (OSError, ValueError):
            continue
    return b"", ""


def _role_logs(primus_home: Path, env: dict[str, str]) -> dict[str, bytes]:
    """`primus status` of the job (what an operator looks at), with the worker's environment."""
    done = subprocess.run(
        [
            str(Path(env["PATH"].split(os.pathsep)[0]) / "python"),
            "-m",
            "primus_lib.cli.main",
            "status",
            str(Path(env["PRIMUS_JOBS_DIR"]) / f"{JOB}.yaml"),
        ],
        env=env,
        capture_output=True,
        timeout=120,
    )
    return {"primus status": done.stdout + done.stderr}


def _stop_job(job, env: dict[str, str]) -> None:
    """Stop the job's roles (the supervisor and its processes): with the worker's environment."""
    subprocess.run(
        [
            str(Path(env["PATH"].split(os.pathsep)[0]) / "python"),
            "-c",
            "import sys; from primus_lib.resources import backend_for; from primus_lib.spec import load_job;"
            "backend_for(load_job(sys.argv[1]), sys.argv[1]).stop()",
            str(job.spec),
        ],
        env=env,
        capture_output=True,
        timeout=120,
    )


def test_the_job_runs_its_windows_with_credentials_from_the_connection_only(secret_run: Run, job_secrets: Secrets):
    done = secret_run.backfill
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"{len(WINDOWS)}/{len(WINDOWS)} windows finished, {len(WINDOWS)} success" in done.stdout, done.stdout
    assert [r["state"] for r in secret_run.runs] == ["success"] * len(WINDOWS)
    progress = [k for k in secret_run.outputs if k.endswith("/trainer/progress.json") and k.startswith("s3://")]
    assert progress, "the trainer's progress is on S3"
    consumed = json.loads(secret_run.outputs[progress[0]])["consumed"]
    assert sorted(consumed) == [f"history/{w}" for w in WINDOWS]
    assert any(k.startswith("ledger table") for k in secret_run.outputs)
    assert any("/logs/" in k for k in secret_run.outputs), "the Airflow task logs were searched"
    assert secret_run.deferred >= 1, "the trainer task waited in the triggerer (S3 progress via the connection id)"
    # The credentials did reach the roles, by the channels meant for them: the S3 connection as a
    # mounted secret file (outside the job's state, gone once the job stopped), the ledger's
    # password in their environment.
    assert job_secrets.s3_secret.encode() in secret_run.role_env
    assert job_secrets.ledger_password.encode() in secret_run.role_env
    assert Path(secret_run.mounted).name.startswith("primus-secrets-"), secret_run.mounted
    assert not any(where.startswith(secret_run.mounted) for where in secret_run.outputs)
    assert not Path(secret_run.mounted).exists(), "the mounted secrets outlived the job"
    print(
        f"searched {len(secret_run.outputs)} outputs, {sum(map(len, secret_run.outputs.values()))} bytes; "
        f"train tasks deferred: {secret_run.deferred}; argv sampled {secret_run.argv.samples} times, "
        f"{len(secret_run.argv.seen)} distinct command lines"
    )


def test_no_output_of_the_run_holds_a_secret(secret_run: Run, job_secrets: Secrets):
    leaks = [
        f"{what} in {where}"
        for where, data in secret_run.outputs.items()
        for what, value in job_secrets.items().items()
        if value.encode() in data
    ]
    assert not leaks, "\n".join(leaks)


def test_no_process_ever_had_a_secret_in_its_argv(secret_run: Run, job_secrets: Secrets):
    """``primus backfill`` (password from a file), Airflow's processes and task runners, the job's
    supervisor and ``primus train``: sampled every 0.2 s over the whole backfill."""
    argv = secret_run.argv
    assert argv.saw("backfill", "--password-file") and argv.saw("primus_lib.resources.supervisor")
    assert argv.saw("primus_lib.cli.main", "train", JOB)  # the trainer role was sampled too
    assert argv.samples >= 50, argv.samples
    leaks = argv.leaks(job_secrets.items())
    assert not leaks, "\n".join(leaks)
