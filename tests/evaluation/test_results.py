"""The results table across worlds, from primus eval's reports (make eval-report)."""

from __future__ import annotations

import json

import pytest

from primus_lib.evaluation.results import BEGIN, END, load, main, table


def _report(root, world, runs):
    (root / world).mkdir(parents=True)
    modes = {name: {"seeds": [0, 1], "auc_per_seed": aucs} for name, aucs in runs.items()}
    (root / world / "report.json").write_text(json.dumps({"world": world, "modes": modes}))


def test_each_baseline_at_its_best_and_mtrm_minus_the_strongest(tmp_path, capsys):
    _report(
        tmp_path,
        "late-heavy",
        {
            "mtrm": [0.70, 0.72],
            "single_tower": [0.69, 0.70],
            "single_tower[lr=0.01]": [0.71, 0.705],
            "online": [0.60, 0.61],
            "offline_then_online": [0.65, 0.66],
            "offline": [0.64, 0.64],
        },
    )
    _report(tmp_path, "complete-labels", {"mtrm": [0.66, 0.67], "online": [0.665, 0.668], "single_tower": [0.66, 0.66]})
    results = load(tmp_path)
    assert [r.world for r in results] == ["complete-labels", "late-heavy"]  # both development worlds
    late = results[1]
    assert late.split == "development" and late.late == 0.4
    assert late.best("single_tower") == ("single_tower[lr=0.01]", pytest.approx(0.7075))
    mean, smallest, versus = late.lead()
    assert versus == "single_tower[lr=0.01]" and mean == pytest.approx(0.0025) and smallest == pytest.approx(-0.01)
    text = table(results)
    assert "| late-heavy | development | 40% | 2 |" in text and "+0.0025 (-0.0100) vs single_tower[lr=0.01]" in text
    doc = tmp_path / "training.md"
    doc.write_text(f"intro\n{BEGIN}\nold table\n{END}\nrest\n")
    assert main([str(tmp_path), "--write", str(doc)]) == 0
    written = doc.read_text()
    assert "old table" not in written and written.startswith("intro\n") and written.endswith("rest\n")
    assert text in written
    capsys.readouterr()
    assert main([str(tmp_path / "nothing")]) == 2
    assert "no <world>/report.json" in capsys.readouterr().err
    (tmp_path / "plain.md").write_text("no markers")
    assert main([str(tmp_path), "--write", str(tmp_path / "plain.md")]) == 2
