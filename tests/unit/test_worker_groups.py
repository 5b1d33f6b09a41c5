"""On several workers (``--dist loadgroup``) the tests of one module, and the tests that use one
session fixture (a server, an oracle's reference run), share a worker: each is made once."""
from __future__ import annotations

import re
from pathlib import Path

from tests.worker_groups import assign

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = '''
import pytest

@pytest.fixture(scope="session")
def server():
    return "one server"

@pytest.fixture(scope="session")
def reference():
    return "one reference run"

@pytest.fixture(scope="session", autouse=True)
def everywhere():
    pass
'''


def _groups(pytester) -> list[set[str]]:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_a="def test_a1(server): pass\ndef test_a2(tmp_path): pass\n",
        test_b="def test_b1(server, tmp_path_factory): pass\n",
        test_c="def test_c1(reference): pass\n",
        test_d="def test_d1(reference): pass\ndef test_d2(): pass\n",
        test_e="def test_e1(tmp_path): pass\n",
        test_f="def test_f1(tmp_path): pass\n",
    )
    items = pytester.inline_genitems()[0]
    return sorted(({item.name for item in members} for members in assign(items).values()), key=sorted)


def test_modules_and_session_fixtures_tie_tests_and_nothing_else_does(pytester):
    # a module's tests stay together (test_a2, test_d2 use no session fixture); the two users of
    # `server` and the two of `reference` pair up; pytest's own session fixtures (tmp_path's
    # factory) and an autouse one tie nothing
    assert _groups(pytester) == [{"test_a1", "test_a2", "test_b1"}, {"test_c1", "test_d1", "test_d2"},
                                 {"test_e1"}, {"test_f1"}]


def test_two_workers_make_each_session_fixture_once(pytester, monkeypatch):
    """A real run on two workers: the two modules that use one session fixture run on one worker,
    which makes the fixture once; the other modules spread over both."""
    made = pytester.path / "made.txt"
    pytester.makeconftest(f'''
import os, pytest

@pytest.fixture(scope="session")
def server():
    with open({str(made)!r}, "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
''')
    pytester.makepyfile(**{f"test_{m}": f"def test_{m}1(server): pass\ndef test_{m}2(server): pass\n" for m in "ab"},
                        **{f"test_{m}": f"def test_{m}1(): pass\ndef test_{m}2(): pass\n" for m in "cdef"})
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p", "tests.worker_groups", "-v")
    result.assert_outcomes(passed=12)
    assert len(made.read_text().split()) == 1, made.read_text()
    workers = {}
    for line in result.stdout.lines:
        found = re.search(r"\[(gw\d)\].* PASSED (test_\w)\.py", line)
        if found:
            workers.setdefault(found.group(2), set()).add(found.group(1))
    assert workers["test_a"] == workers["test_b"] and len(workers["test_a"]) == 1, workers
    assert set().union(*workers.values()) == {"gw0", "gw1"}, workers   # the rest spread
