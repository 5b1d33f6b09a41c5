"""On several workers (``--dist loadgroup``) the tests of one module, and the tests that use one
session fixture (a server, an oracle's reference run), share a worker: each is made once."""
from __future__ import annotations

from tests.worker_groups import assign

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


def test_the_marks_are_given_only_for_loadgroup(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_a="def test_a1(server): pass\n", test_b="def test_b1(server): pass\n")
    plain = pytester.inline_genitems("-p", "tests.worker_groups")[0]
    assert not any(item.get_closest_marker("xdist_group") for item in plain)
    grouped = pytester.inline_genitems("-p", "tests.worker_groups", "--dist", "loadgroup")[0]
    names = {item.get_closest_marker("xdist_group").args[0] for item in grouped}
    assert len(names) == 1, names
