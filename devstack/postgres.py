"""PostgreSQL 15 for the live stack: Airflow's metadata database, kept across ``down``/``up``.

``initdb`` once into ``<dir>/data`` (superuser ``postgres``, trust on the Unix socket, scram on
TCP), then ``postgres`` on 127.0.0.1:<port> with its socket in ``<dir>``; the first start creates
the ``airflow`` role and database. Stopped with SIGINT to the postmaster (fast shutdown: a clean
checkpoint, nothing lost). As root the cluster belongs to the ``postgres`` system user
(PostgreSQL refuses root), as in tests/fixtures/postgres.py. Debian's binaries come from
scripts/install-system.sh; ``$PG_BINDIR`` overrides.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path

from devstack.daemon import Daemon

ROLE = "airflow"
SUPERUSER = "postgres"


def bindir() -> Path:
    """initdb/postgres: $PG_BINDIR, Debian's newest /usr/lib/postgresql/<v>/bin, else PATH."""
    candidates = [os.environ.get("PG_BINDIR", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    found = shutil.which("initdb")
    candidates += [str(Path(found).parent)] if found else []
    for candidate in filter(None, candidates):
        if all((Path(candidate) / name).is_file() for name in ("initdb", "postgres", "pg_isready")):
            return Path(candidate)
    raise RuntimeError("PostgreSQL server binaries (initdb, postgres) not found: run scripts/install-system.sh")


def cluster_owner() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError("running as root and no `postgres` system user to own the cluster") from None


class Postgres:
    """The stack's cluster in ``root`` (data/, the socket, the password of the ``airflow`` role)."""

    def __init__(self, root: Path, port: int, run_dir: Path, log_dir: Path, password: str = "primus-airflow-db"):
        self.root, self.port, self.password = root, port, password
        self.data = root / "data"
        self.daemon = Daemon("postgres", run_dir, log_dir)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{ROLE}:{self.password}@127.0.0.1:{self.port}/{ROLE}"

    def _env_and_user(self) -> tuple[dict[str, str], dict]:
        owner = cluster_owner()
        env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        if owner is None:
            return env, {}
        env["HOME"] = owner.pw_dir
        return env, {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}

    def _chown(self, path: Path) -> None:
        owner = cluster_owner()
        if owner is not None:
            os.chown(path, owner.pw_uid, owner.pw_gid)

    def init(self) -> bool:
        """initdb unless the cluster exists; True if it was created now."""
        if (self.data / "PG_VERSION").exists():
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        self._chown(self.root)
        env, user = self._env_and_user()
        args = [
            str(bindir() / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--no-instructions",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ]
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=180, **user)
        if done.returncode != 0:
            raise RuntimeError(f"initdb {self.data} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return True

    def ready(self) -> bool:
        args = [str(bindir() / "pg_isready"), "-q", "-h", str(self.root), "-p", str(self.port), "-U", SUPERUSER]
        return subprocess.run(args, capture_output=True, timeout=5).returncode == 0

    def start(self, timeout: float = 60.0) -> None:
        created = self.init()
        env, user = self._env_and_user()
        # PostgreSQL's durable defaults (fsync, synchronous_commit): the ledger and the training queue
        # live here, and a crash must not lose a commit a worker was told about (tests/reliability).
        args = [
            str(bindir() / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.root}",
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=64MB",
        ]
        self.daemon.log.parent.mkdir(parents=True, exist_ok=True)
        self.daemon.spawn(args, env, cwd=self.root, **user)
        self.daemon.wait_ready(self.ready, timeout)
        if created or not self._has_role():
            self._sql(f"CREATE ROLE \"{ROLE}\" LOGIN PASSWORD '{self.password}'")
            self._sql(f'CREATE DATABASE "{ROLE}" OWNER "{ROLE}"')

    def _admin(self):
        import psycopg2

        conn = psycopg2.connect(host=str(self.root), port=self.port, user=SUPERUSER, dbname="postgres")
        conn.autocommit = True
        return conn

    def _has_role(self) -> bool:
        conn = self._admin()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (ROLE,))
                return cur.fetchone() is not None
        finally:
            conn.close()

    def _sql(self, statement: str) -> None:
        conn = self._admin()
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()

    def stop(self) -> bool:
        return self.daemon.stop(signal.SIGINT, timeout=60, group=False)  # the postmaster: fast shutdown
