"""docs/spec.md's field reference is generated from the spec models and up to date."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_lib.spec.job import JobSpec
from primus_lib.spec.reference import main, rewrite, rows

DOC = Path(__file__).resolve().parents[2] / "docs" / "spec.md"


def test_the_committed_reference_is_the_generated_one():
    text = DOC.read_text()
    assert rewrite(text) == text, "run: python -m primus_lib.spec.reference docs/spec.md"


def test_every_model_and_training_field_is_listed_with_its_default():
    listed = {path: (kind, default) for path, kind, default, _ in rows()}
    for section in ("model", "training"):
        model = JobSpec.model_fields[section].annotation
        for name in model.model_fields:
            assert f"spec.{section}.{name}" in listed
    assert listed["spec.model.serve"][1] == "`mixture`" and listed["spec.training.learning_rate"][1] == "`0.004`"
    assert listed["spec.dataset.streams[].lag"] == ("duration", "`0s`")


def test_the_command_refuses_a_page_without_markers(tmp_path, capsys):
    page = tmp_path / "spec.md"
    page.write_text("no markers")
    assert main([str(page)]) == 2 and "expected the markers" in capsys.readouterr().err
    with pytest.raises(ValueError):
        rewrite("nothing")
