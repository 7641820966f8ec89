"""primus_lib.naming: the names Primus gives things in Airflow keep their values (they are in every
deployment's history), and no other module of the packages or the DAG folder spells one of them
(read from the source, like tests/test_layers.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from primus_lib import naming

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [*(ROOT / "primus_lib").rglob("*.py"), *(ROOT / "plugins").rglob("*.py"), *(ROOT / "dags").glob("*.py")]
)
NAMING = ROOT / "primus_lib" / "naming.py"


def test_the_names_are_the_ones_in_airflow_history():
    assert naming.TAG == "primus"
    assert naming.pool_name("ctr-demo") == "primus-ctr-demo"
    assert naming.pool_job("primus-ctr-demo") == "ctr-demo"
    assert naming.pool_job("default_pool") is None and naming.pool_job(None) is None
    assert (naming.TRAIN_TASK, naming.SCALE_TASK, naming.JOIN_TASK, naming.SINK_TASK) == (
        "train",
        "scale",
        "join",
        "sink",
    )
    assert naming.source_task("clicks") == "source_clicks" and naming.execute_task("clicks") == "execute_clicks"
    assert (naming.MODE_PARAM, naming.WINDOW_PARAM) == ("mode", "window_start")
    assert naming.asset_uri("ctr-demo", "history") == "primus://ctr-demo/history"
    assert naming.asset_uri("ctr-demo", naming.MODEL_ASSET) == "primus://ctr-demo/model"
    assert naming.API_CONNECTION == "primus_airflow_api"


def test_jobs_dir_is_the_setting_else_the_checkouts_config_jobs(monkeypatch, tmp_path):
    monkeypatch.delenv("PRIMUS_JOBS_DIR", raising=False)
    assert naming.jobs_dir() == ROOT / "config" / "jobs"
    monkeypatch.setenv("PRIMUS_JOBS_DIR", str(tmp_path))
    assert naming.jobs_dir() == tmp_path.resolve()
    for name in ("b.yml", "a.yaml", "notes.txt", "c.json"):
        (tmp_path / name).write_text("")
    (tmp_path / "d.yaml").mkdir()
    assert [p.name for p in naming.spec_files()] == ["a.yaml", "b.yml"]
    assert naming.spec_files(tmp_path / "missing") == []


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.JoinedStr) or _is_text(node)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is(node: ast.AST, value: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def _texts(node: ast.AST) -> list[str]:
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant)]
    return [node.value] if _literal(node) else []


def _spelled(node: ast.AST) -> str | None:
    """Which name of primus_lib.naming ``node`` spells as a literal, or None."""
    if any("primus://" in text for text in _texts(node)):
        return "an asset URI (naming.asset_uri)"
    if any(_is(node, name) for name in (naming.POOL_PREFIX, naming.API_CONNECTION)):
        return f"{node.value!r} (naming)"
    if isinstance(node, ast.JoinedStr) and _texts(node) == [naming.POOL_PREFIX] and len(node.values) == 2:
        return "a pool name (naming.pool_name)"
    if isinstance(node, ast.keyword) and node.arg in ("task_id", "pool", "tags") and _literal(node.value):
        return f"a literal {node.arg}= (naming)"
    if isinstance(node, ast.keyword) and node.arg == "tags" and isinstance(node.value, ast.List | ast.Tuple):
        return "the tag (naming.TAG)" if any(_is(e, naming.TAG) for e in node.value.elts) else None
    if isinstance(node, ast.Assign) and _is(node.value, naming.TAG):
        return "the tag (naming.TAG)" if any("TAG" in getattr(t, "id", "") for t in node.targets) else None
    if isinstance(node, ast.Compare):
        sides = (node.left, *node.comparators)
        if any(_is(side, naming.TAG) for side in sides):
            return "the tag (naming.TAG)"
        if any(getattr(side, "attr", None) == "task_id" for side in sides) and any(map(_literal, sides)):
            return "a task id (naming)"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and _literal(node.args[0]):
        if node.func.attr in ("get_task", "has_task") or getattr(node.func.value, "attr", None) == "task_id":
            return "a task id (naming)"  # dag.get_task("train"), TI.task_id.like("%.execute_%")
    return None


def spelled_in(source: str) -> list[tuple[int, str]]:
    """(line, what) of each name spelled in ``source``. Docstrings may name them; the text around an
    f-string's values ("primus-{job}-{stream}") is judged with its f-string."""
    tree = ast.parse(source)
    skip = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    skip |= {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and _is_text(node.value)}
    return [(node.lineno, what) for node in ast.walk(tree) if id(node) not in skip and (what := _spelled(node))]


def test_no_module_but_naming_spells_a_name():
    assert NAMING in SOURCES and len(SOURCES) > 100
    spelled = [
        f"{path.relative_to(ROOT)}:{line}: spells {what}"
        for path in SOURCES
        if path != NAMING
        for line, what in spelled_in(path.read_text(encoding="utf-8"))
    ]
    assert spelled == []


@pytest.mark.parametrize(
    "code",
    [
        'Asset(f"primus://{job}/model")',
        'ensure_pool(f"primus-{dag_id}", 1)',
        'POOL_PREFIX = "primus-"',
        'DAG(dag_id="x", tags=["primus", f"window:{w}"])',
        'PRIMUS_TAG = "primus"',
        'select(DagTag.dag_id).where(DagTag.name == "primus")',
        'PrimusJoinerOperator(task_id="join", spec_path=p)',
        'Op.partial(task_id=f"execute_{name}", pool=pool)',
        'dag.has_task("train")',
        'TI.task_id.like("%.execute\\\\_%", escape="\\\\")',
        'select(XComModel).where(XComModel.task_id == "train")',
        'Sensor(spec_path=p, airflow_conn_id="primus_airflow_api")',
    ],
)
def test_the_scan_finds_each_way_the_names_were_spelled(code):
    assert spelled_in(code), code
