"""The package layering of primus_lib (docs/architecture.md, "Dependencies"), read from the source:
an import that crosses a layer the wrong way fails here, lazy imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "primus_lib"

# package (or top-level module) -> what of primus_lib it may import: a package (any module in it)
# or one module ("resources.limits"); a package absent here is unrestricted
ALLOWED: dict[str, set[str]] = {
    "timegrid": set(),
    "durable": set(),
    # the deployment settings (the only reader of the environment) and the connection resolver are leaves
    "settings": {"markdown"},
    "credentials": {"settings"},
    "filesystems": {"credentials"},
    "storage": {"credentials", "durable", "filesystems"},
    "commands": set(),
    "naming": {"settings"},
    "airflow_api": {"timegrid"},
    "markdown": set(),
    "spec": {"markdown", "settings", "timegrid"},
    "paths": {"credentials", "settings", "spec", "storage"},
    "progress": {"durable", "storage"},
    "allocation": {"durable", "paths", "spec", "storage"},
    # the instruments read a process tree's RSS through proctree (a leaf: it imports nothing of primus_lib)
    "metrics": {"paths", "settings", "spec", "storage", "resources.proctree"},
    # the data plane runs its tasks under the executors' limits and its stream executors announce
    # themselves through the backend's discovery; nothing else of resources
    "data": {
        "allocation",
        "credentials",
        "durable",
        "filesystems",
        "metrics",
        "paths",
        "progress",
        "settings",
        "spec",
        "storage",
        "timegrid",
        "resources.limits",
        "resources.discovery",
    },
    "resources": {
        "allocation",
        "commands",
        "credentials",
        "durable",
        "metrics",
        "paths",
        "settings",
        "spec",
        "storage",
        "timegrid",
    },
    "scaling": {"airflow_api", "allocation", "durable", "metrics", "paths", "resources", "spec", "storage", "timegrid"},
    "jobview": {
        "allocation",
        "data",
        "metrics",
        "naming",
        "paths",
        "progress",
        "scaling",
        "spec",
        "storage",
        "timegrid",
    },
}


def _imports(path: Path) -> set[str]:
    """What of primus_lib one file imports (top level or inside functions), as ``package.module``
    (or the top-level module's name)."""
    dotted = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "primus_lib":
            if node.module == "primus_lib":
                dotted |= {f"primus_lib.{alias.name}" for alias in node.names}
            else:
                dotted |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            dotted |= {a.name for a in node.names if a.name.startswith("primus_lib.")}
    return {".".join(name.split(".")[1:3]) for name in dotted}


def _allowed(owner: str, name: str) -> bool:
    package = name.split(".")[0]
    return package in {owner, "__version__"} or package in ALLOWED[owner] or name in ALLOWED[owner]


def _owner(path: Path) -> str:
    rel = path.relative_to(LIB).with_suffix("")
    return rel.parts[0]


@pytest.mark.parametrize("owner", sorted(ALLOWED))
def test_no_import_crosses_a_layer(owner):
    files = [p for p in LIB.rglob("*.py") if _owner(p) == owner]
    assert files, owner
    wrong = {
        f"{p.relative_to(LIB.parent)} imports primus_lib.{name}"
        for p in files
        for name in _imports(p)
        if not _allowed(owner, name)
    }
    assert not wrong, sorted(wrong)


def test_primus_lib_never_imports_airflow():
    offenders = []
    for path in LIB.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.relative_to(LIB.parent)}: {n}" for n in names if n.split(".")[0] == "airflow"]
    assert not offenders, offenders
