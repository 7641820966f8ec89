"""The deployment settings (primus_lib/settings.py): the only reader of the environment in primus_lib,
the plugin and the DAGs (read from the source, as tests/test_layers.py reads imports), at most 15
variables, each in the generated table of docs/settings.md."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from primus_lib import settings as s

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [ROOT / "primus_lib", ROOT / "plugins", ROOT / "dags"]
ALLOWED = {ROOT / "primus_lib" / "settings.py"}
# TEMPORARY: the lead is rewriting these packages and converts their reads (see the issue 30 report);
# remove each entry when its package reads only primus_lib.settings.
EXEMPT: set[Path] = set()
WRITES = {"update", "pop", "__setitem__", "__delitem__"}  # setting variables for children is not reading


def _environ_reads(path: Path) -> list[str]:
    """``file:line`` of every read of the process environment: ``os.environ`` used any way but as the
    target of an assignment, ``del``, ``.update`` or ``.pop``; ``os.getenv``; ``from os import environ``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [where for alias in node.names if alias.name in ("environ", "getenv", "environb")]
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"):
            continue
        if node.attr in ("getenv", "getenvb", "environb"):
            found.append(where)
        elif node.attr == "environ":
            parent = parents.get(node)
            written = isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store | ast.Del)
            called = isinstance(parent, ast.Attribute) and parent.attr in WRITES
            if not (written or called):
                found.append(where)
    return found


def _scanned_files() -> list[Path]:
    files = [p for base in SCANNED for p in base.rglob("*.py") if p not in ALLOWED]
    return [p for p in files if not any(p.is_relative_to(e) for e in EXEMPT) and "__pycache__" not in p.parts]


def test_only_the_settings_module_reads_the_environment():
    reads = [hit for path in _scanned_files() for hit in _environ_reads(path)]
    assert reads == [], (
        f"read the environment through primus_lib.settings (a deployment fact) or put the switch in the spec: {reads}"
    )


def test_the_scan_sees_every_form_of_a_read(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nfrom os import getenv\n"
        "a = os.environ.get('A')\nb = os.environ['B']\nc = 'C' in os.environ\nd = os.getenv('D')\n"
        "e = dict(os.environ)\nf = os.environ.copy()\ng = os.environ.setdefault('G', '1')\n"
        "os.environ['H'] = '1'\nos.environ.update(I='1')\nos.environ.pop('J', None)\ndel os.environ['K']\n"
    )
    rows = sorted(int(hit.rsplit(":", 1)[1]) for hit in _environ_reads_at(sample))
    assert rows == [2, 3, 4, 5, 6, 7, 8, 9]  # the writes of lines 10-13 are not reads


def _environ_reads_at(path: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, path.parent
    try:
        return _environ_reads(path)
    finally:
        ROOT = saved


def test_at_most_fifteen_variables_each_in_the_docs_table():
    assert len(s.VARIABLES) <= 15 and len(set(s.VARIABLES)) == len(s.VARIABLES)
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert s.render(page) == page, "docs/settings.md is stale: run `python -m primus_lib.settings docs/settings.md`"
    for name in s.VARIABLES:
        assert f"| `{name}` |" in page


def test_a_value_that_does_not_parse_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.setenv("PRIMUS_REPLICA_INDEX", "two")
    with pytest.raises(ValueError, match=r"^\$PRIMUS_REPLICA_INDEX='two': input should be a valid integer") as bad:
        s.settings()
    assert "\n" not in str(bad.value)


def test_settings_follow_the_environment_and_default_when_unset(monkeypatch, tmp_path):
    monkeypatch.delenv("PRIMUS_HOME", raising=False)
    assert s.settings().home == Path(".primus")
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path))
    monkeypatch.setenv("PRIMUS_REPLICA_INDEX", "3")
    assert (s.settings().home, s.settings().replica_index) == (tmp_path, 3)


def test_render_needs_both_markers():
    with pytest.raises(ValueError, match="markers"):
        s.render("# Settings\nno table here\n")
    assert s.table() in s.render(f"x\n{s.BEGIN}\nold\n{s.END}\ny\n")
