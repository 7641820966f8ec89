"""docker-compose.yaml cannot run here (no Docker engine); check that it is coherent."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_services_and_mounts_exist():
    compose = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
    services = compose["services"]
    for name in ("postgres", "api-server", "scheduler", "dag-processor", "triggerer", "kafka", "s3", "prometheus"):
        assert name in services
    for name, service in services.items():
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name} uses undeclared volume {source}"
    assert (ROOT / services["api-server"]["build"]["dockerfile"]).exists()
