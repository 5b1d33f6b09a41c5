"""A failed test's report carries the supervisor's errors and fatal signs from its live servers'
logs (tests/server_events.py)."""
from __future__ import annotations

import sys

from client.service_process import ServiceProcess
from tests.server_events import server_events

LOG = """I1207 tritonserver started
2026-12-07 01:49:01,982 [supervisor] INFO tritonserver ready (pid 1); watching a
double free or corruption (out)
Signal (6) received.
2026-12-07 01:49:05,100 [supervisor] ERROR tritonserver killed by signal 6; it is restarted
I1207 model loaded
"""


class Sleeper(ServiceProcess):
    name = "sleeper"

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]

    def ready(self) -> bool:
        return True


def test_only_the_events_are_kept(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    events = server_events(Sleeper(log)).splitlines()
    assert events == ["double free or corruption (out)", "Signal (6) received.",
                      "2026-12-07 01:49:05,100 [supervisor] ERROR tritonserver killed by signal 6; it is restarted"]
    assert len(server_events(Sleeper(log), max_lines=1).splitlines()) == 1


def test_a_stopped_server_is_no_longer_live(tmp_path):
    with Sleeper(tmp_path / "a.log") as server:
        assert server in Sleeper.live()
    assert server not in Sleeper.live()


def test_a_failed_test_shows_its_servers_events(pytester, tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    pytester.makepyfile(f"""
import pytest
from tests.unit.test_server_events import Sleeper

@pytest.fixture(scope="module")
def server():
    with Sleeper({str(log)!r}) as s:
        yield s

def test_passes(server):
    pass

def test_fails(server):
    assert False, "the server went away"
""")
    result = pytester.runpytest("-p", "tests.server_events")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "sleeper events" in out and "double free or corruption (out)" in out
    assert out.count("killed by signal 6") == 1   # the passing test adds nothing
