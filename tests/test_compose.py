"""docker-compose.yaml and its Prometheus configuration, checked by the real tools that exist without
a Docker engine: Compose's own validator (`docker-compose config`, Debian's docker-compose 1.29,
installed by scripts/install-system.sh) and `promtool` (Debian's prometheus). No image is built and no
container started here (no engine; docs/status.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from devstack.airflow import COMPONENTS

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yaml"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed: run scripts/install-system.sh (Debian's {name} package)"
    return path


def _compose_config(path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [_tool("docker-compose"), "--project-directory", str(ROOT), "-f", str(path), "config", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_compose_validates_with_compose_itself():
    done = _compose_config(COMPOSE)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)  # anchors merged, ${VAR:-default} interpolated
    env = resolved["services"]["scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:airflow@postgres:")
    # one JWT secret for every Airflow component (task tokens are signed by the api-server)
    secrets = {resolved["services"][name]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"] for name in COMPONENTS}
    assert len(secrets) == 1 and secrets != {""}


def test_the_validator_rejects_what_compose_would_refuse(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "services:\n  a:\n    image: x\n    depends_on: {b: {condition: service_finished}}\n  b: {image: y}\n"
    )
    done = _compose_config(bad, "-q")
    assert done.returncode != 0 and "services.a.depends_on.b.condition" in done.stderr


def test_the_services_are_those_of_make_up():
    """devstack/stack.py's servers (PostgreSQL, Kafka, Prometheus, Airflow's four components) run by
    default; the optional S3 store only with its profile."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    default = {name for name, s in services.items() if not s.get("profiles")}
    assert default == {"postgres", "kafka", "prometheus", "airflow-init", *COMPONENTS}
    assert services["s3"]["profiles"] == ["s3"]
    for name in COMPONENTS:  # the same command as the stack's daemons: `airflow <component>`
        command = services[name]["command"]
        assert command[:2] == ["airflow", name] or re.search(rf"exec airflow {name}$", command[-1]), command
    for name in ("scheduler", "triggerer", "dag-processor", "api-server"):  # the demo's storage, shared
        assert "primus-state:/var/lib/primus" in services[name]["volumes"]


def test_mounted_files_and_build_inputs_exist():
    compose = yaml.safe_load(COMPOSE.read_text())
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).is_file(), f"{name} mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name} uses undeclared volume {source}"
    dockerfile = ROOT / compose["services"]["api-server"]["build"]["dockerfile"]
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                if not source.startswith("--"):
                    assert (ROOT / source).exists(), f"{dockerfile.name}: COPY of missing {source}"


def test_prometheus_configuration_passes_promtool(tmp_path):
    """docker/prometheus.yml as Prometheus would load it, with the rules file at its mount point
    replaced by the repository's and the scrape token's by a file here."""
    rules = ROOT / "config" / "prometheus" / "primus-rules.yml"
    text = (ROOT / "docker" / "prometheus.yml").read_text()
    assert "/etc/prometheus/primus-rules.yml" in text
    config = tmp_path / "prometheus.yml"
    token = "/var/lib/primus/prometheus/metrics.token"  # written by airflow-init on the shared volume
    assert token in text
    (tmp_path / "metrics.token").write_text("t")
    config.write_text(
        text.replace("/etc/prometheus/primus-rules.yml", str(rules)).replace(token, str(tmp_path / "metrics.token"))
    )
    done = subprocess.run(
        [_tool("promtool"), "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr
