"""What a test needs from the machine it runs on (a reference venv, a tool such as curl or a C
compiler): one rule for all of them. Outside CI a missing piece skips the test and says how to get
it; under ``CI=true`` it fails, because there a missing piece is a broken set-up and a skipped
parity or system test would pass unnoticed."""
from __future__ import annotations

import os

import pytest


def under_ci() -> bool:
    """True when the environment variable ``CI`` says so (``true`` or ``1``, any case)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require(present: bool, missing: str) -> None:
    """Return when ``present``; otherwise skip the calling test (or fixture) with ``missing`` as
    the reason, or fail it under CI. ``missing`` names the piece and the command that installs it."""
    if present:
        return
    if under_ci():
        pytest.fail(f"{missing}; CI=true requires it", pytrace=False)
    pytest.skip(missing)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Under CI no test skips silently: a skip from anywhere (a ``skipif`` mark, a call outside
    this module) is reported as a failure (an error where it came from set-up) that gives the
    skip's reason. (A plugin: tests/conftest.py registers this module.)"""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and under_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where no test may skip: {reason}"
