"""The PrimusJob CustomResourceDefinition, generated from the same pydantic models.

Pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3.0 schema:
no ``$ref``, a ``type`` on every node, ``nullable`` instead of ``anyOf [.., null]``, boolean
``exclusiveMinimum``, and no ``additionalProperties: false`` next to ``properties``.
"""

from __future__ import annotations

from typing import Any

import yaml

from primus_lib.spec.job import API_VERSION, KIND, JobSpec

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "primusjobs"

_DROP = {"title", "default", "examples"}


def spec_schema() -> dict[str, Any]:
    schema = JobSpec.model_json_schema(mode="validation")
    return _structural(schema, schema.get("$defs", {}))


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    node = {k: v for k, v in node.items() if k not in _DROP and k != "$defs"}
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        branches = [b for b in node["anyOf"] if b != {"type": "null"}]
        nullable = len(branches) < len(node["anyOf"])
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(branches) == 1:
            node = _structural({**branches[0], **rest}, defs)
        else:
            node = {**rest, "anyOf": [_structural(b, defs) for b in branches]}
        if nullable:
            node["nullable"] = True
        return node
    if "const" in node:
        node["enum"] = [node.pop("const")]
        node.setdefault("type", "string")
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node.get(bound), bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    if "properties" in node:
        node["type"] = "object"
        node["properties"] = {k: _structural(v, defs) for k, v in node["properties"].items()}
        if node.get("additionalProperties") is False:
            del node["additionalProperties"]
    elif node.get("type") == "object":
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            node["additionalProperties"] = _structural(extra, defs)
        else:
            node.pop("additionalProperties", None)
            node["x-kubernetes-preserve-unknown-fields"] = True
    if "items" in node:
        node["items"] = _structural(node["items"], defs)
    if node.get("type") == "array" and "prefixItems" in node:
        node.pop("prefixItems")
    if not node or (set(node) <= {"description"}):
        node["x-kubernetes-preserve-unknown-fields"] = True
    return node


def crd() -> dict[str, Any]:
    status = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "phase": {"type": "string"},
            "observedGeneration": {"type": "integer"},
            "conditions": {
                "type": "array",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "primusjob", "kind": KIND, "shortNames": ["pj"]},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Mode", "type": "string", "jsonPath": ".spec.training.mode"},
                        {"name": "Backend", "type": "string", "jsonPath": ".spec.resources.backend"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `primus crd` from primus_lib/spec; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
