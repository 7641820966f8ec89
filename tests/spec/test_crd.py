from __future__ import annotations

from pathlib import Path

import yaml

from primus_lib.spec.crd import crd, crd_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_generated_crd_copy_is_up_to_date():
    committed = (ROOT / "config" / "crd" / "primusjob.yaml").read_text()
    assert committed == crd_yaml(), "config/crd/primusjob.yaml is stale: run `primus crd > config/crd/primusjob.yaml`"


def _walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def test_crd_schema_is_structural():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node, path
        assert "$defs" not in node, path
        assert "const" not in node, path
        assert not ("properties" in node and node.get("additionalProperties") is False), path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True, path
        if path.endswith(".properties") or path.endswith("anyOf"):
            continue
        if path.split(".")[-2:-1] == ["properties"] or path.endswith("items") or path.endswith("additionalProperties"):
            has_type = (
                "type" in node
                or node.get("x-kubernetes-int-or-string")
                or node.get("x-kubernetes-preserve-unknown-fields")
            )
            assert has_type, f"{path} has no type"


def test_crd_has_status_subresource_and_names():
    doc = yaml.safe_load(crd_yaml())
    assert doc["metadata"]["name"] == "primusjobs.primus.dev"
    version = doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert doc["spec"]["names"]["kind"] == "PrimusJob"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["timer"]["properties"]["window"]["enum"] == ["1h", "1d"]
