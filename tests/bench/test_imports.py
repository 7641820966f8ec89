"""Every name a benchmark imports from this repository exists.

Benchmarks import test helpers and project modules, often inside functions (a measured child
process imports what it measures), so a helper moved or renamed breaks a bench only when it runs,
long after the change: bench/executor.py and bench/stream.py imported ``job_doc`` from
``tests.data.helpers`` for a day after it moved to ``tests.fixtures.specs``. This reads each bench's
imports without running it and resolves every one that names a module of this repository.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
OURS = ("primus_lib", "primus_operators", "tests", "devstack", "bench")
BENCHES = sorted(BENCH.glob("*.py"))


def _ours(module: str) -> bool:
    root = module.split(".")[0]
    return root in OURS or (BENCH / f"{root}.py").exists()


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute import in ``path`` that names one of our modules."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _ours(node.module):
            found.append((node.lineno, node.module, [a.name for a in node.names if a.name != "*"]))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, []) for a in node.names if _ours(a.name))
    return found


def test_every_bench_is_read() -> None:
    assert len(BENCHES) >= 8, BENCHES
    assert sum(len(_imports(path)) for path in BENCHES) > 30


@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.name)
def test_what_a_bench_imports_from_the_repository_exists(path: Path, monkeypatch) -> None:
    for entry in (ROOT / "plugins", BENCH, ROOT):
        monkeypatch.syspath_prepend(str(entry))
    missing = []
    for line, module, names in _imports(path):
        try:
            loaded = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{path.name}:{line}: import {module}: {exc}")
            continue
        for name in names:
            if hasattr(loaded, name):
                continue
            submodule = hasattr(loaded, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None
            if not submodule:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    assert not missing, "\n".join(missing)
