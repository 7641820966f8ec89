"""Shared fixtures and the server markers.

Each real server has its own fixture module under tests/fixtures/. A test that uses a server's
fixture gets that server's marker (and ``integration``) automatically, so
``pytest -m "kafka or hdfs"`` selects exactly the tests that talk to those servers. Under CI a
skipped test fails the run: a server that could not be started is a failure, never a skip.
Hypothesis runs without deadlines (the "primus" profile).
"""

from __future__ import annotations

from collections.abc import Generator

import pytest
from hypothesis import settings

from tests import type_check
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
    "kafka_server": "kafka",
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

# No per-example deadline: property tests check results, never our speed, and a loaded 2-core CI
# machine makes Hypothesis' 200 ms default flaky. Printing the blob lets CI failures be replayed.
settings.register_profile("primus", deadline=None, print_blob=True)
settings.load_profile("primus")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = {SERVER_FIXTURES[name] for name in getattr(item, "fixturenames", ()) if name in SERVER_FIXTURES}
        for marker in sorted(used):
            item.add_marker(getattr(pytest.mark, marker))
        if used or any(item.get_closest_marker(m) for m in SERVER_MARKERS):
            item.add_marker(pytest.mark.integration)


def pytest_collection_finish(session: pytest.Session) -> None:
    """mypy runs beside the tests from here on (tests/type_check.py), when its test was collected."""
    if not session.config.option.collectonly and any(item.nodeid.endswith(type_check.TEST) for item in session.items):
        type_check.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    type_check.stop()


def _ci_failure(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn a skip into a failure under CI: nothing the suite needs may be silently absent. Done
    inside the report's making, so pytest counts (and summarises) a failure, never a skip."""
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (a skip is a failure there): {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield  # made by pytest's own implementations (xfail's wrapper included: wasxfail is set)
    _ci_failure(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield  # a module-level pytest.skip(allow_module_level=True) or importorskip
    _ci_failure(report)
    return report
