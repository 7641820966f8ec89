"""One store (docs/contracts.md, "Job state"): the local disk is one backend of ``primus_lib.storage``
among the others, so no code outside the store asks which kind of location it holds. Read from the
source (AST, like tests/test_layers.py), in primus_lib and the Airflow plugin: an ``isinstance``
check against a path or location type, a call of a "which kind?" helper, or a signature taking "a
Path or a StorageLocation" (two storage worlds) fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "primus_lib" / "storage"
# what a location may be told apart by: the path types and the store's own type
KINDS = {"Path", "PurePath", "PosixPath", "PurePosixPath", "PathLike", "StorageLocation"}
ASKS = {"is_remote", "is_local"}  # helpers that answer "which kind?" (the store had one)


def _names(node: ast.AST | None) -> set[str]:
    """The type names in an expression (``a.B`` gives ``B``; tuples and ``X | Y`` give each)."""
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return set()
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
    return found


def branches_on_location_kind(source: str) -> list[str]:
    """Where ``source`` asks which kind of location it holds, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            callee = _names(node.func) & {"isinstance", *ASKS}
            if "isinstance" in callee and len(node.args) == 2 and _names(node.args[1]) & KINDS:
                found.append(f"{node.lineno}: isinstance(..., {ast.unparse(node.args[1])})")
            elif callee & ASKS:
                found.append(f"{node.lineno}: {ast.unparse(node.func)}(...)")
        annotations = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            annotations = [a.annotation for a in arguments] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        for annotation in annotations:
            names = _names(annotation)
            if "StorageLocation" in names and names & (KINDS - {"StorageLocation"}):
                found.append(f"{annotation.lineno}: {ast.unparse(annotation)} (two storage worlds)")
    return found


def _sources() -> list[Path]:
    files = [*(ROOT / "primus_lib").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]
    return sorted(p for p in files if STORE not in p.parents)


def test_no_code_outside_the_store_asks_which_kind_of_location_it_holds():
    files = _sources()
    assert len(files) > 100  # the packages were found
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in files
        if (found := branches_on_location_kind(path.read_text(encoding="utf-8")))
    }
    assert not offenders, f"use the store's operations (primus_lib.storage), not a branch on the kind: {offenders}"


@pytest.mark.parametrize(
    "source",
    [
        "if isinstance(where, Path):\n    where.mkdir()",
        "if isinstance(where, StorageLocation):\n    where.put_atomic(b'')",
        "ok = isinstance(where, (str, pathlib.Path))",
        "ok = isinstance(where, Path | StorageLocation)",
        "if is_remote(target):\n    pass",
        "def save(directory: Path | StorageLocation) -> None: ...",
        "def load(directory: 'StorageLocation | os.PathLike') -> None: ...",
    ],
)
def test_the_check_catches_each_way_of_asking(source):
    assert branches_on_location_kind(source), source


def test_the_check_leaves_other_isinstance_calls_alone():
    source = "def f(x: StorageLocation, y: int | None) -> str:\n    return isinstance(x, str) or isinstance(y, URL)"
    assert branches_on_location_kind(source) == []
