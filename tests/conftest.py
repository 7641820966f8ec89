"""Shared fixtures and the server markers.

Each real server has its own fixture module under tests/fixtures/. A test that uses a server's
fixture gets that server's marker (and ``integration``) automatically, so
``pytest -m "kafka or hdfs"`` selects exactly the tests that talk to those servers. Under CI a
skipped test fails the run: a server that could not be started is a failure, never a skip.
"""

from __future__ import annotations

import pytest

from tests.fixtures._require import in_ci

pytest_plugins: list[str] = [
    "tests.fixtures.kafka",
    "tests.fixtures.s3",
    "tests.fixtures.kube",
    "tests.fixtures.prometheus",
    "tests.fixtures.airflow",
    "tests.fixtures.postgres",
    "tests.fixtures.hadoop",
]

# fixture name -> the marker of the server it starts
SERVER_FIXTURES: dict[str, str] = {
    "kafka_broker": "kafka",
    "s3_server": "s3",
    "s3_env": "s3",
    "kube_apiserver": "kube",
    "kube_apiserver_b": "kube",
    "kube_cluster": "kube",
    "prometheus_server": "prometheus",
    "airflow_server": "airflow",
    "airflow_api_server": "airflow",
    "postgres_server": "postgres",
    "hdfs_cluster": "hdfs",
    "yarn_cluster": "yarn",
}
SERVER_MARKERS = sorted(set(SERVER_FIXTURES.values()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = {SERVER_FIXTURES[name] for name in getattr(item, "fixturenames", ()) if name in SERVER_FIXTURES}
        for marker in sorted(used):
            item.add_marker(getattr(pytest.mark, marker))
        if used or any(item.get_closest_marker(m) for m in SERVER_MARKERS):
            item.add_marker(pytest.mark.integration)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under CI a skip is a failure: nothing the suite needs may be silently absent."""
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under CI (a skip is a failure there): {reason}"
