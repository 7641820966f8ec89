"""No module of primus_lib over 400 lines (docs/architecture.md): a module that grows past it holds
more than one concept and is split, not trimmed of its docstrings."""

from __future__ import annotations

from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "primus_lib"
MAX_LINES = 400


def test_no_primus_lib_module_is_over_400_lines():
    sizes = {path.relative_to(LIB.parent): len(path.read_text().splitlines()) for path in LIB.rglob("*.py")}
    assert len(sizes) > 50  # the package was found
    over = {str(path): lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"split these modules (at most {MAX_LINES} lines each): {over}"
