"""A missing reference venv or tool skips a test outside CI and fails it under ``CI=true``, through
one helper (tests/requirement.py) that every oracle and tool check calls."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.requirement import require, under_ci


def _set_ci(monkeypatch, ci: str | None) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_missing_piece_skips_outside_ci(ci, monkeypatch):
    _set_ci(monkeypatch, ci)
    assert not under_ci()
    with pytest.raises(pytest.skip.Exception, match=r"^curl is not installed \(apt-get install curl\)$"):
        require(False, "curl is not installed (apt-get install curl)")


@pytest.mark.parametrize("ci", ["true", "TRUE", " True ", "1"])
def test_a_missing_piece_fails_under_ci(ci, monkeypatch):
    _set_ci(monkeypatch, ci)
    assert under_ci()
    with pytest.raises(pytest.fail.Exception, match=r"^curl is not installed; CI=true requires it$"):
        require(False, "curl is not installed")


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_present_piece_passes(ci, monkeypatch):
    _set_ci(monkeypatch, ci)
    require(True, "never shown")


# each family's oracle check: (fixtures module, the path it looks for, the check, the install command)
ORACLES = [
    ("tests.qwen3_fixtures", "QWEN3_ORACLE_PYTHON", "require_qwen3_oracle", "make oracle"),
    ("tests.qwen3_omni_fixtures", "QWEN3_OMNI_ORACLE_PYTHON", "require_qwen3_omni_oracle", "make omni-oracle"),
    ("tests.voxcpm2_fixtures", "VOXCPM2_ORACLE_PYTHON", "require_voxcpm2_oracle", "make voxcpm-oracle"),
]


@pytest.mark.parametrize("module,path,check,install", ORACLES, ids=[o[0].split(".")[1] for o in ORACLES])
@pytest.mark.parametrize("ci,outcome", [(None, pytest.skip.Exception), ("false", pytest.skip.Exception),
                                        ("true", pytest.fail.Exception), ("1", pytest.fail.Exception)])
def test_a_missing_oracle_skips_outside_ci_and_fails_under_it(module, path, check, install, ci, outcome,
                                                              monkeypatch, tmp_path):
    fixtures = importlib.import_module(module)
    monkeypatch.setattr(fixtures, path, tmp_path / "missing" / "python")
    _set_ci(monkeypatch, ci)
    with pytest.raises(outcome, match=f"reference venv missing: .*missing/python .*`{install}`"):
        getattr(fixtures, check)()


@pytest.mark.parametrize("module,path,check,install", ORACLES, ids=[o[0].split(".")[1] for o in ORACLES])
def test_a_present_oracle_passes_under_ci(module, path, check, install, monkeypatch, tmp_path):
    fixtures = importlib.import_module(module)
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setattr(fixtures, path, python)
    monkeypatch.setenv("CI", "true")
    getattr(fixtures, check)()


def test_no_other_copy_of_the_rule():
    """The CI check lives in tests/requirement.py only: no test or fixture reads ``CI`` itself."""
    tests = Path(__file__).resolve().parents[1]
    readers = [str(p.relative_to(tests)) for p in tests.rglob("*.py")
               if p.name != "requirement.py" and p != Path(__file__).resolve()
               and ('environ.get("CI"' in p.read_text() or "environ.get('CI'" in p.read_text())]
    assert readers == []


SKIPPING = '''
import pytest

@pytest.mark.skipif(True, reason="no such device here")
def test_marked():
    pass

def test_called():
    pytest.skip("no such tool here")

@pytest.mark.xfail(reason="a known bug")
def test_known_bug():
    assert False

def test_passes():
    pass
'''


@pytest.mark.parametrize("ci", [None, "true"])
def test_no_skip_is_silent_under_ci(ci, pytester, monkeypatch):
    """Any skip, not only the helper's, fails under CI=true and says why; xfail stays xfail."""
    _set_ci(monkeypatch, ci)
    pytester.makepyfile(SKIPPING)
    result = pytester.runpytest("-p", "tests.requirement", "-rfs")
    if ci is None:
        result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    else:
        # a skipif mark skips in set-up, so its test ends as an error; a call in the test, as a failure
        result.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1)
        result.stdout.fnmatch_lines(["*skipped under CI=true, where no test may skip: no such device here*",
                                     "*skipped under CI=true, where no test may skip: no such tool here*"])
