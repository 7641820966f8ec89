"""tests/conftest.py's rule, run in an inner pytest (pytester): under CI a skip fails the run,
reported as a failure (with and without ``-ra``); elsewhere a skip stays a skip."""

from __future__ import annotations

import pytest

from tests import conftest

pytest_plugins = ["pytester"]

SKIPPING = """
import pytest

def test_needs_a_server():
    pytest.skip("no kafka here")

@pytest.mark.xfail(reason="known bug")
def test_known_bug():
    assert False

def test_fine():
    pass
"""

SKIPPED_MODULE = """
import pytest

pytest.skip("no hdfs here", allow_module_level=True)

def test_never_collected():
    pass
"""


class Hooks:
    """Only the report hooks of tests/conftest.py (not its server fixtures) in the inner run."""

    pytest_runtest_makereport = staticmethod(conftest.pytest_runtest_makereport)
    pytest_make_collect_report = staticmethod(conftest.pytest_make_collect_report)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess(*args, "-p", "no:cacheprovider", plugins=[Hooks()])


@pytest.mark.parametrize("summary", [[], ["-ra"]], ids=["plain", "with-ra"])
def test_under_ci_a_skip_fails_the_run(pytester, monkeypatch, summary):
    monkeypatch.setenv("CI", "1")
    pytester.makepyfile(test_inner=SKIPPING)
    result = _run(pytester, *summary)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1, xfailed=1)  # the xfail stays an xfail
    text = result.stdout.str()
    assert "INTERNALERROR" not in text
    assert "skipped under CI (a skip is a failure there): Skipped: no kafka here" in text
    if summary:  # the short summary names the failure
        assert "FAILED test_inner.py::test_needs_a_server" in text


def test_under_ci_a_skipped_module_fails_the_run(pytester, monkeypatch):
    monkeypatch.setenv("CI", "1")
    pytester.makepyfile(test_inner=SKIPPED_MODULE)
    result = _run(pytester, "-ra")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error stops the session
    result.assert_outcomes(errors=1)
    assert "skipped under CI (a skip is a failure there)" in result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str()


def test_without_ci_a_skip_stays_a_skip(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_inner=SKIPPING, test_module=SKIPPED_MODULE)
    result = _run(pytester, "-ra")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    for line in ("SKIPPED ?1? test_inner.py:*: no kafka here", "SKIPPED ?1? test_module.py:*: no hdfs here"):
        result.stdout.fnmatch_lines([line])


def test_hypothesis_has_no_deadline():
    """The "primus" profile (tests/conftest.py): no example fails for being slow on a loaded machine."""
    from hypothesis import settings

    assert settings().deadline is None and settings.get_profile("primus").deadline is None
