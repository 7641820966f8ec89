"""Prometheus (Debian's ``prometheus``) for the live stack, its TSDB kept across ``down``/``up``.

config/prometheus/prometheus.yml is the Kubernetes configuration (Debian's build lacks
kubernetes_sd_configs), so the stack writes its own ``<dir>/prometheus.yml``: Prometheus itself,
plus file-based discovery of ``<dir>/targets/*.json`` (the embedded default's executors and
trainers that serve /metrics on 127.0.0.1, as in config/prometheus/prometheus.yml's
``primus-local`` job), and the rules of config/prometheus/primus-rules.yml.
"""

from __future__ import annotations

import os
import shutil
import signal
import urllib.request
from pathlib import Path

from devstack.daemon import Daemon

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
    static_configs:
      - targets: ["127.0.0.1:{port}"]
  - job_name: primus-local
    file_sd_configs:
      - files: ["{targets}/*.json"]
        refresh_interval: 10s
"""


class Prometheus:
    def __init__(self, root: Path, port: int, run_dir: Path, log_dir: Path) -> None:
        self.root, self.port = root, port
        self.targets = root / "targets"
        self.daemon = Daemon("prometheus", run_dir, log_dir)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
            return reply.status == 200

    def start(self, timeout: float = 60.0) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus not installed: run scripts/install-system.sh (Debian's prometheus)")
        self.targets.mkdir(parents=True, exist_ok=True)
        config = self.root / "prometheus.yml"
        config.write_text(CONFIG.format(rules=RULES, port=self.port, targets=self.targets))
        args = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.daemon.spawn(args, dict(os.environ), cwd=self.root)
        self.daemon.wait_ready(self.ready, timeout)

    def stop(self) -> bool:
        return self.daemon.stop(signal.SIGTERM, timeout=30)
