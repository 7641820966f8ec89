"""Shared fixtures. Each real server has its own fixture module under tests/fixtures/."""

from __future__ import annotations

pytest_plugins: list[str] = [
    "tests.fixtures.kafka",
    "tests.fixtures.s3",
    "tests.fixtures.kube",
    "tests.fixtures.prometheus",
    "tests.fixtures.airflow",
]
