"""Tests that need the reference venv skip without it, and fail under CI (``CI=true``)."""
from __future__ import annotations

import pytest

import tests.qwen3_fixtures as fixtures


@pytest.fixture
def no_oracle(monkeypatch, tmp_path):
    monkeypatch.setattr(fixtures, "QWEN3_ORACLE_PYTHON", tmp_path / "missing" / "python")


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_a_missing_oracle_skips_outside_ci(ci, no_oracle, monkeypatch):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="reference venv missing"):
        fixtures.require_qwen3_oracle()


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_a_missing_oracle_fails_under_ci(ci, no_oracle, monkeypatch):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="CI=true requires the oracle"):
        fixtures.require_qwen3_oracle()


def test_a_present_oracle_passes(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setattr(fixtures, "QWEN3_ORACLE_PYTHON", python)
    monkeypatch.setenv("CI", "true")
    fixtures.require_qwen3_oracle()
