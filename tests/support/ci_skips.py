"""Under CI=true a skipped test fails the run: every optional dependency the README names
is installed by .ci/run, so a skip there means an install step is missing, and it must
show instead of hiding behind a green run. Each skip is listed with its reason (which
names the package to install). Loaded by tests/conftest.py."""

from __future__ import annotations

import os

import pytest


def ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


class SkipsFailCI:
    def __init__(self) -> None:
        self.skipped: list[str] = []

    def _note(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else longrepr
            self.skipped.append(f"{report.nodeid}: {reason}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.skipped:
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"CI=true: {len(self.skipped)} skipped test(s) fail the run "
                "(a missing install step in .ci/run?)",
                red=True,
            )
            for line in self.skipped:
                reporter.write_line(f"  SKIPPED {line}", red=True)
        if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    if ci():
        config.pluginmanager.register(SkipsFailCI(), "arm-core-ci-skips")
