"""The evaluation tests run the trainer on the train tests' tiny job."""

from __future__ import annotations

from tests.train.conftest import tiny  # noqa: F401  (the fixture)
