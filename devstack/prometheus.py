"""Prometheus (Debian's ``prometheus``) for the live stack, its TSDB kept across ``down``/``up``.

config/prometheus/prometheus.yml is the Kubernetes configuration (Debian's build lacks
kubernetes_sd_configs), so the stack writes its own ``<dir>/prometheus.yml``: Prometheus itself,
plus file-based discovery of ``<dir>/targets/*.json`` (the embedded default's executors and
trainers that serve /metrics on 127.0.0.1, as in config/prometheus/prometheus.yml's
``primus-local`` job), and the rules of config/prometheus/primus-rules.yml.

Its API and UI ask for the stack's login (``--web.config.file``: basic auth, the password as a
bcrypt hash); its scrape of itself logs in with the same. Clients get it as the connection
``primus_prometheus`` (``<dir>/secrets``, ``AIRFLOW_CONN_PRIMUS_PROMETHEUS``). It scrapes the
roles' /metrics with the bearer token of the stack's ``secrets/metrics.token`` (made once, 0600),
the roles' own mounted secret: they serve only to it.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import urllib.request
from pathlib import Path

from devstack.daemon import Daemon
from devstack.private import write_private

RULES = Path(__file__).resolve().parents[1] / "config" / "prometheus" / "primus-rules.yml"

CONFIG = """\
# Written by devstack/prometheus.py on every `up` (edit the module, not this file).
global:
  scrape_interval: 15s
  evaluation_interval: 15s
rule_files:
  - {rules}
scrape_configs:
  - job_name: prometheus
    basic_auth:
      username: {user}
      password_file: {password_file}
    static_configs:
      - targets: ["127.0.0.1:{port}"]
  - job_name: primus-local
    authorization:
      credentials_file: {token_file}
    file_sd_configs:
      - files: ["{targets}/*.json"]
        refresh_interval: 10s
"""


def web_config(user: str, password: str) -> str:
    """``--web.config.file`` with one basic-auth user; Prometheus wants the password as a bcrypt
    hash: the C library's, through ``crypt`` (deprecated, still in Python 3.11's library)."""
    import crypt

    return f"basic_auth_users:\n  {user}: {crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n"


def authorized(url: str, user: str, password: str) -> urllib.request.Request:
    """A request to ``url`` with the basic-auth header of ``user``."""
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    return urllib.request.Request(url, headers={"Authorization": f"Basic {basic}"})


class Prometheus:
    def __init__(
        self, root: Path, port: int, run_dir: Path, log_dir: Path, user: str, password: str, metrics_token: Path
    ) -> None:
        self.root, self.port, self.user, self.password = root, port, user, password
        self.metrics_token_file = metrics_token
        self.targets = root / "targets"
        self.daemon = Daemon("prometheus", run_dir, log_dir)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connection(self) -> str:
        conn = {"conn_type": "http", "host": "127.0.0.1", "port": self.port, "login": self.user}
        return json.dumps({**conn, "password": self.password})

    def metrics_token(self) -> Path:
        """The bearer token it presents to the roles' /metrics (made once, kept across up/down)."""
        path = self.metrics_token_file
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_private(path, secrets.token_urlsafe(24))
        return path

    def ready(self) -> bool:
        with urllib.request.urlopen(authorized(f"{self.url}/-/ready", self.user, self.password), timeout=2) as reply:
            return reply.status == 200

    def start(self, timeout: float = 60.0) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus not installed: run scripts/install-system.sh (Debian's prometheus)")
        self.targets.mkdir(parents=True, exist_ok=True)
        password_file = write_private(self.root / "scrape-password", self.password)
        web = write_private(self.root / "web.yml", web_config(self.user, self.password))
        config = self.root / "prometheus.yml"
        config.write_text(
            CONFIG.format(
                rules=RULES,
                port=self.port,
                targets=self.targets,
                user=self.user,
                password_file=password_file,
                token_file=self.metrics_token(),
            )
        )
        args = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.config.file={web}",
            "--log.level=warn",
        ]
        self.daemon.spawn(args, dict(os.environ), cwd=self.root)
        self.daemon.wait_ready(self.ready, timeout)

    def stop(self) -> bool:
        return self.daemon.stop(signal.SIGTERM, timeout=30)
