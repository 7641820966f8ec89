"""config/helm/values.yaml (the official Airflow chart's values for Primus) against this repository:
the identity, namespace, image and secrets it names exist where docs/deploy-kubernetes.md says. The
chart itself is not rendered here (no helm, no chart download); its keys follow chart 1.22.0."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
VALUES = yaml.safe_load((ROOT / "config" / "helm" / "values.yaml").read_text())
DOC = (ROOT / "docs" / "deploy-kubernetes.md").read_text()


def _rbac() -> list[dict]:
    return [
        d for f in sorted((ROOT / "config" / "rbac").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d
    ]


def test_the_controller_identity_is_config_rbac_s_in_its_namespace():
    env = {e["name"]: e["value"] for e in VALUES["env"]}
    namespace = env["PRIMUS_KUBE_NAMESPACE"]
    accounts = {(d["metadata"]["name"], d["metadata"]["namespace"]) for d in _rbac() if d["kind"] == "ServiceAccount"}
    for account in (
        VALUES["workers"]["serviceAccount"],
        VALUES["workers"]["kubernetes"]["serviceAccount"],
        VALUES["triggerer"]["serviceAccount"],
    ):
        assert account == {"create": False, "name": "primus-controller"}
        assert (account["name"], namespace) in accounts
    bound = {(s["name"], s["namespace"]) for d in _rbac() if d["kind"] == "RoleBinding" for s in d["subjects"]}
    assert ("primus-controller", namespace) in bound
    assert f"-n {namespace}" in DOC and f"kubectl create namespace {namespace}" in DOC


def test_executor_image_and_airflow_version_match_the_dockerfile():
    dockerfile = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    version = re.search(r"^FROM apache/airflow:(\d+\.\d+\.\d+)-python3\.11$", dockerfile, re.M).group(1)
    assert VALUES["airflowVersion"] == VALUES["images"]["airflow"]["tag"] == version
    lock = (ROOT / "requirements" / "lock.txt").read_text()
    assert f"apache-airflow=={version}\n" in lock  # the image runs the Airflow the tests run
    assert VALUES["executor"] == "KubernetesExecutor" and VALUES["postgresql"]["enabled"] is False
    # DAG files are baked into the image where the Dockerfile generates them
    assert VALUES["dags"]["mountPath"] == "/opt/primus/dags" and "python /opt/primus/dags/primus_dags.py" in dockerfile
    assert VALUES["dags"]["gitSync"]["enabled"] is False


def test_every_secret_the_values_name_is_created_in_the_guide():
    names = {
        VALUES["data"]["metadataSecretName"],
        VALUES["fernetKeySecretName"],
        VALUES["apiSecretKeySecretName"],
        VALUES["jwtSecretName"],
    } | {s["secretName"] for s in VALUES["secret"]}
    created = set(re.findall(r"create secret generic ([a-z0-9-]+)", DOC))
    assert names == created
    for item in VALUES["secret"]:  # the key each env var reads is the one the guide creates
        assert re.search(
            rf"secret generic {item['secretName']}[^\n]*(\n[^\n]*)?--from-literal={item['secretKey']}=", DOC
        ), item
    assert {s["envName"] for s in VALUES["secret"]} >= {"AIRFLOW_CONN_PRIMUS_STORAGE_DEFAULT", "PRIMUS_DATABASE"}
